//! A transaction's age, for wound-wait: the timestamp of its UUIDv7 id. An
//! older transaction wounds a younger holder; a wounded attempt retries
//! under a new id of the same age, so it cannot starve.

/// The timestamp a UUIDv7 transaction id carries: its age for wound-wait.
pub fn txn_age(id: &str) -> (u64, &str) {
    let millis = uuid::Uuid::parse_str(id)
        .ok()
        .and_then(|u| u.get_timestamp())
        .map(|ts| {
            let (secs, nanos) = ts.to_unix();
            secs * 1000 + u64::from(nanos) / 1_000_000
        })
        .unwrap_or(u64::MAX);
    (millis, id)
}

/// A new transaction id with the same age (timestamp) as `id`.
pub(crate) fn same_age(id: &str) -> String {
    let ts = uuid::Uuid::parse_str(id).ok().and_then(|u| u.get_timestamp());
    match ts {
        Some(ts) => {
            let (secs, nanos) = ts.to_unix();
            uuid::Uuid::new_v7(uuid::Timestamp::from_unix(uuid::NoContext, secs, nanos)).to_string()
        }
        None => uuid::Uuid::now_v7().to_string(),
    }
}

/// Whether transaction `a` is older than `b` (wound-wait priority).
pub(crate) fn older(a: &str, b: &str) -> bool {
    txn_age(a) < txn_age(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_age_keeps_the_timestamp() {
        let a = uuid::Uuid::now_v7().to_string();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = same_age(&a);
        assert_ne!(a, b);
        assert_eq!(txn_age(&a).0, txn_age(&b).0);
    }

    #[test]
    fn uuid_v7_ids_order_by_age() {
        let a = uuid::Uuid::now_v7().to_string();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = uuid::Uuid::now_v7().to_string();
        assert!(older(&a, &b));
        assert!(!older(&b, &a));
        assert!(!older(&a, &a));
    }
}
