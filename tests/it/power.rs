//! Power loss on a simulated disk (see `txgate::store::powerloss`): the
//! embedded store crashed at every write and sync of a workload, reopened
//! on what each crash left, and checked.

use txgate::store::powerloss::{Sweep, sweep};

/// Every crash point of the workload once, with four survivor images
/// each (everything written, only what was synced, two random subsets
/// with the interrupted write possibly torn), and a two-crash sequence at
/// every third point. The seed changes per run unless
/// `TXGATE_POWER_SEED` pins it; a failure names it. The bench's
/// `--power` sweeps more images per point.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_survives_power_loss_at_every_write_and_sync() {
    let seed = std::env::var("TXGATE_POWER_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    let cfg = Sweep { seed, images_per_point: 4, two_crash_every: 3, progress_every: 0 };
    let report = sweep(&cfg).await.unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "power loss: seed {}, {} writes and syncs in the workload, {} crash points ({:?}), {} survivor images, {} two-crash sequences",
        report.seed, report.ops, report.crash_points, report.by_op, report.images, report.two_crash
    );
    assert_eq!(report.crash_points, report.ops, "every write and sync was a crash point");
    assert!(
        report.by_op.get("sync").copied().unwrap_or(0) > 10 && report.by_op.get("write").copied().unwrap_or(0) > 50
    );
}
