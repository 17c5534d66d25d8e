//! Which CPUs a sandbox runs on, chosen once for every backend: as many whole CPUs as its
//! CPU limit rounds up to, so that `nproc` inside agrees with the limit. The bubblewrap
//! backend pins the thread that starts a sandbox to them; the Docker backend names them as
//! the container's `cpuset-cpus`. Both keep their CPU quota as well.

use std::sync::atomic::{AtomicUsize, Ordering};

use rustix::thread::CpuSet;

/// The CPUs a sandbox with `cpu_millis` runs on: as many whole CPUs as its limit rounds up
/// to, of those in `allowed`, taken in turn (so that sandboxes spread over the host), or
/// `None` when the limit is as many as `allowed` holds (then nothing is pinned).
pub(crate) fn sandbox_cpus(allowed: &CpuSet, cpu_millis: u32) -> Option<CpuSet> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let cpus: Vec<usize> = (0..CpuSet::MAX_CPU)
        .filter(|&cpu| allowed.is_set(cpu))
        .collect();
    let wanted = usize::try_from(cpu_millis.div_ceil(1000).max(1)).unwrap_or(usize::MAX);
    if wanted >= cpus.len() {
        return None;
    }
    let first = NEXT.fetch_add(wanted, Ordering::Relaxed);
    let mut pinned = CpuSet::new();
    for k in 0..wanted {
        pinned.set(cpus[(first + k) % cpus.len()]);
    }
    Some(pinned)
}

/// The first `count` CPUs, numbered from 0 (as a container engine that reports `count` CPUs
/// numbers them), at most [`CpuSet::MAX_CPU`].
#[cfg_attr(not(feature = "docker"), allow(dead_code))]
pub(crate) fn first_cpus(count: usize) -> CpuSet {
    let mut set = CpuSet::new();
    for cpu in 0..count.min(CpuSet::MAX_CPU) {
        set.set(cpu);
    }
    set
}

/// `set` in the list form of Linux's cpusets and Docker's `cpuset-cpus`: `0,2,3`.
#[cfg_attr(not(feature = "docker"), allow(dead_code))]
pub(crate) fn cpu_list(set: &CpuSet) -> String {
    (0..CpuSet::MAX_CPU)
        .filter(|&cpu| set.is_set(cpu))
        .map(|cpu| cpu.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandbox_gets_the_whole_cpus_its_limit_rounds_up_to_in_turn() {
        let mut allowed = CpuSet::new();
        for cpu in [0, 2, 3, 5] {
            allowed.set(cpu);
        }
        let pinned = |millis| sandbox_cpus(&allowed, millis).map(|set| set.count());
        assert_eq!(pinned(10), Some(1));
        assert_eq!(pinned(1000), Some(1));
        assert_eq!(pinned(1001), Some(2));
        assert_eq!(pinned(2500), Some(3));
        assert_eq!(pinned(4000), None, "as many as allowed: not pinned");
        assert_eq!(pinned(64_000), None);
        // Only allowed CPUs, and one sandbox after another on different ones.
        let firsts: Vec<usize> = (0..4)
            .map(|_| {
                let set = sandbox_cpus(&allowed, 1000).expect("pinned");
                (0..8).find(|&cpu| set.is_set(cpu)).expect("one CPU")
            })
            .collect();
        let mut sorted = firsts.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, [0, 2, 3, 5], "{firsts:?}");
    }

    #[test]
    fn a_cpu_set_is_written_as_a_list() {
        assert_eq!(cpu_list(&first_cpus(3)), "0,1,2");
        let mut set = CpuSet::new();
        set.set(5);
        set.set(1);
        assert_eq!(cpu_list(&set), "1,5");
        assert_eq!(cpu_list(&first_cpus(0)), "");
    }
}
