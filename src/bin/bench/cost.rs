//! What requests cost this process: processor time, every thread's, the
//! kernel's work for them included, between [`Meter::start`] and
//! [`Meter::stop`]. The gateway and its clients run in this one process,
//! so a figure is both sides; the bare floor (`/healthz`, or one page's
//! bytes from a bare server) measured the same way is what the client
//! and HTTP cost alone, and the difference is the gateway's own part.
//! (Background work running meanwhile, checkpoints and syncs, counts too:
//! it is what the requests cause.)

use std::time::Duration;

/// Processor time this process has used, all threads.
fn cpu_now() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(u64::try_from(t.tv_sec).unwrap_or(0), u32::try_from(t.tv_nsec).unwrap_or(0))
}

/// A measurement under way.
pub struct Meter(Duration);

impl Meter {
    pub fn start() -> Self {
        Self(cpu_now())
    }

    pub fn stop(self) -> Spent {
        Spent { cpu: cpu_now().saturating_sub(self.0) }
    }
}

/// What some requests cost, in all.
#[derive(Debug, Default, Clone, Copy)]
pub struct Spent {
    pub cpu: Duration,
}

impl Spent {
    pub fn add(&mut self, other: Spent) {
        self.cpu += other.cpu;
    }

    /// Processor microseconds per request, of `n`.
    pub fn per(&self, n: usize) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / n.max(1) as f64
    }
}
