//! Choosing among weighted targets: nginx's smooth weighted round robin (the sequence for 3:2 is
//! A B A B A: no burst of one target), shared by every worker.
//!
//! For weights whose sum (after dividing by their greatest common divisor) is at most
//! [`TABLE_MAX`], the whole cycle is computed once when the instance is built and a request
//! takes the next entry with one atomic increment. Larger sums keep nginx's running state behind
//! a lock held for the arithmetic of one pick.

use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

/// The longest cycle kept as a table.
pub const TABLE_MAX: u64 = 4096;

/// A weighted choice among `n` targets.
pub enum Picker {
    /// One target (or one with weight): no state at all.
    Single(usize),
    /// The precomputed cycle and where the next pick is.
    Table { cycle: Box<[u16]>, next: AtomicUsize },
    /// nginx's running state: `(weight, current)` per target of positive weight, and each one's
    /// index.
    Running { state: Mutex<Vec<(i64, i64)>>, index: Box<[usize]> },
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// One step of the smooth weighted round robin over `state` (`(weight, current)` pairs).
fn step(state: &mut [(i64, i64)]) -> usize {
    let total: i64 = state.iter().map(|(w, _)| w).sum();
    let mut best = 0;
    for i in 0..state.len() {
        state[i].1 += state[i].0;
        if state[i].1 > state[best].1 {
            best = i;
        }
    }
    state[best].1 -= total;
    best
}

impl Picker {
    /// A picker over `weights` (the index of a target is its position). `None` when no weight
    /// is positive: nothing can be picked.
    pub fn new(weights: &[u32]) -> Option<Picker> {
        let positive: Vec<usize> = (0..weights.len()).filter(|&i| weights[i] > 0).collect();
        match positive.as_slice() {
            [] => return None,
            [only] => return Some(Picker::Single(*only)),
            _ => {}
        }
        let divisor = positive.iter().map(|&i| u64::from(weights[i])).fold(0, gcd).max(1);
        let mut state: Vec<(i64, i64)> =
            positive.iter().map(|&i| ((u64::from(weights[i]) / divisor) as i64, 0)).collect();
        let total: u64 = state.iter().map(|(w, _)| *w as u64).sum();
        if total > TABLE_MAX || weights.len() > usize::from(u16::MAX) {
            return Some(Picker::Running { state: Mutex::new(state), index: positive.into() });
        }
        let cycle: Vec<u16> = (0..total).map(|_| positive[step(&mut state)] as u16).collect();
        Some(Picker::Table { cycle: cycle.into(), next: AtomicUsize::new(0) })
    }

    /// The next target.
    pub fn pick(&self) -> usize {
        match self {
            Picker::Single(i) => *i,
            Picker::Table { cycle, next } => usize::from(cycle[next.fetch_add(1, Ordering::Relaxed) % cycle.len()]),
            Picker::Running { state, index } => index[step(&mut state.lock())],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn picks(weights: &[u32], n: usize) -> Vec<usize> {
        let p = Picker::new(weights).unwrap_or_else(|| panic!("{weights:?} has a positive weight"));
        (0..n).map(|_| p.pick()).collect()
    }

    #[test]
    fn the_sequence_is_nginx_smooth_one() {
        assert_eq!(picks(&[3, 2], 10), [0, 1, 0, 1, 0, 0, 1, 0, 1, 0]);
        assert_eq!(picks(&[5, 1, 1], 7), [0, 0, 1, 0, 2, 0, 0], "nginx's documented 5:1:1");
        assert_eq!(picks(&[30, 20], 5), picks(&[3, 2], 5), "divided by the gcd");
    }

    #[test]
    fn weight_zero_is_never_picked_and_all_zero_picks_nothing() {
        assert!(picks(&[0, 1, 0], 20).iter().all(|&i| i == 1));
        assert!(picks(&[4, 0, 1], 50).iter().all(|&i| i != 1));
        assert!(Picker::new(&[0, 0]).is_none());
        assert!(Picker::new(&[]).is_none());
    }

    #[test]
    fn large_weights_keep_the_proportions_without_a_table() {
        let p = Picker::new(&[1_000_000, 1]).unwrap_or_else(|| panic!("positive"));
        assert!(matches!(p, Picker::Running { .. }));
        let got: Vec<usize> = (0..1000).map(|_| p.pick()).collect();
        assert_eq!(got.iter().filter(|&&i| i == 1).count(), 0, "1 in a million");
        let even = Picker::new(&[4097, 4096]).unwrap_or_else(|| panic!("positive"));
        let ones = (0..8193).filter(|_| even.pick() == 1).count();
        assert_eq!(ones, 4096, "a whole cycle keeps the exact counts");
        assert_eq!(picks(&[u32::MAX, u32::MAX], 4), [0, 1, 0, 1], "no overflow at the largest weights");
    }
}
