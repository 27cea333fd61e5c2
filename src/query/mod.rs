//! The query language (docs/design.md §7): filters ([`filter`]) and which
//! declared index serves a query exactly ([`plan`]). Running a query is
//! [`crate::queries`]'.

pub(crate) mod filter;
pub(crate) mod plan;
pub(crate) mod rule;
