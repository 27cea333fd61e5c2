//! The storage engine (the `txgate-store` crate, re-exported here whole) and
//! the one layer the gateway adds over it: [`deadline`], which bounds every
//! store call and records it in the gateway's metrics.

pub(crate) use txgate_store::*;

pub(crate) mod deadline;
