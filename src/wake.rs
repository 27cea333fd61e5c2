//! Waiting on a condition that a [`Notify`] announces changes of, without
//! a timer: checked now, then again after each wake-up.

use tokio::sync::Notify;

/// Until `holds` answers `true`, checked now and after each wake-up of
/// `wake` (woken with `notify_waiters` after what `holds` reads changed;
/// the wake-up is armed before each check, so none is missed).
pub async fn until(wake: &Notify, mut holds: impl FnMut() -> bool) {
    loop {
        let woken = wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        if holds() {
            return;
        }
        woken.await;
    }
}
