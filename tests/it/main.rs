//! Integration tests: one binary, a real gateway over HTTP against both
//! stores (MongoDB through the server `scripts/test` starts).

mod support;

mod auth;
mod backup;
mod collections;
mod conflicts;
mod console;
mod crash;
mod declared_indexes;
mod docs;
mod documents;
mod events;
mod faults;
mod faulty;
mod hooks;
mod hostile;
mod indexes;
mod instances;
mod kill;
mod limits;
mod live;
mod memory;
mod metrics;
mod openapi;
mod power;
mod problems;
mod props;
mod queries;
mod reads;
mod restart;
mod rules;
mod rules_events;
mod rules_props;
mod schemas;
mod secrets;
mod slow;
mod store;
mod subscriptions;
mod transactions;
mod upgrade;
mod users;
