//! What requests cost this process: processor time, every thread's, the
//! kernel's work for them included, between [`Meter::start`] and
//! [`Meter::stop`]. The gateway and its clients run in this one process,
//! so a figure is both sides; the bare floor (`/healthz`, or one page's
//! bytes from a bare server) measured the same way is what the client
//! and HTTP cost alone, and the difference is the gateway's own part.
//! (Background work running meanwhile, checkpoints and syncs, counts too:
//! it is what the requests cause.)
//!
//! A bench built with the `alloc-count` feature also counts allocations
//! (every thread's, client included), printed beside the times; its times
//! are slower than a plain build's and are not compared.

use std::time::Duration;

/// Allocations this process has made so far (`None`: not counted).
#[cfg(feature = "alloc-count")]
fn allocs_now() -> Option<u64> {
    let stats = super::ALLOC.stats();
    Some((stats.allocations + stats.reallocations) as u64)
}

#[cfg(not(feature = "alloc-count"))]
fn allocs_now() -> Option<u64> {
    None
}

/// Processor time this process has used, all threads.
fn cpu_now() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(u64::try_from(t.tv_sec).unwrap_or(0), u32::try_from(t.tv_nsec).unwrap_or(0))
}

/// A measurement under way.
pub struct Meter(Duration, Option<u64>);

impl Meter {
    pub fn start() -> Self {
        Self(cpu_now(), allocs_now())
    }

    pub fn stop(self) -> Spent {
        let allocs = self.1.zip(allocs_now()).map(|(then, now)| now.saturating_sub(then));
        Spent { cpu: cpu_now().saturating_sub(self.0), allocs }
    }
}

/// What some requests cost, in all.
#[derive(Debug, Default, Clone, Copy)]
pub struct Spent {
    pub cpu: Duration,
    /// Allocations and reallocations (with `alloc-count` only).
    pub allocs: Option<u64>,
}

impl Spent {
    pub fn add(&mut self, other: Spent) {
        self.cpu += other.cpu;
        self.allocs = match (self.allocs, other.allocs) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
    }

    /// Allocations per request, of `n` (with `alloc-count` only).
    pub fn allocs_per(&self, n: usize) -> Option<f64> {
        self.allocs.map(|a| a as f64 / n.max(1) as f64)
    }

    /// Processor microseconds per request, of `n`.
    pub fn per(&self, n: usize) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / n.max(1) as f64
    }
}
