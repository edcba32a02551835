//! What the lanes of the nemesis share: the budget of affected voters (never more than
//! [`MAX_AFFECTED`](crate::checker::MAX_AFFECTED) at once, however many lanes inject, and
//! lanes waiting for room served first come, first served), and the stop signal.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The voters a lane has taken out of the budget, and until when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Busy {
    Free,
    /// Taken by a lane until it gives the voter back.
    Held,
    /// Given back, but still affected until then (a restarted master abstaining).
    Until(Instant),
}

#[derive(Debug)]
struct State {
    busy: Vec<Busy>,
    /// A scenario holds every voter (see [`Budget::exclusive`]): nothing else is taken.
    exclusive: bool,
    /// The lanes waiting in [`Budget::take_in_turn`], in arrival order: only the first may
    /// take (a lane that heals and injects again at once would otherwise starve the
    /// others).
    queue: VecDeque<u64>,
    next_ticket: u64,
}

impl State {
    fn affected(&self, now: Instant) -> usize {
        self.busy
            .iter()
            .filter(|b| match b {
                Busy::Free => false,
                Busy::Held => true,
                Busy::Until(t) => *t > now,
            })
            .count()
    }

    fn is_free(&self, i: usize, now: Instant) -> bool {
        match self.busy[i] {
            Busy::Free => true,
            Busy::Held => false,
            Busy::Until(t) => t <= now,
        }
    }
}

/// The voters affected by faults, shared by every lane: at most `max` at once.
#[derive(Debug)]
pub(in crate::checker) struct Budget {
    state: Mutex<State>,
    changed: Condvar,
    max: usize,
}

impl Budget {
    pub(in crate::checker) fn new(voters: usize, max: usize) -> Self {
        Self {
            state: Mutex::new(State {
                busy: vec![Busy::Free; voters],
                exclusive: false,
                queue: VecDeque::new(),
                next_ticket: 0,
            }),
            changed: Condvar::new(),
            max,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes `n` voters, chosen at random among the free ones `eligible` accepts, when the
    /// budget has room for `n` more and every lane that asked before has had its turn;
    /// waits for that (checking every 50 ms, and at once when voters are given back).
    /// `None` when told to stop first.
    pub(super) fn take_in_turn(
        &self,
        rng: &mut fastrand::Rng,
        n: usize,
        eligible: impl Fn(usize) -> bool,
        stop: &Stop,
    ) -> Option<Vec<usize>> {
        let mut state = self.lock();
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        state.queue.push_back(ticket);
        loop {
            if stop.is_set() {
                state.queue.retain(|&t| t != ticket);
                drop(state);
                self.changed.notify_all();
                return None;
            }
            if state.queue.front() == Some(&ticket) {
                if let Some(taken) = Self::try_take(&mut state, self.max, rng, n, &eligible) {
                    state.queue.pop_front();
                    drop(state);
                    self.changed.notify_all();
                    return Some(taken);
                }
            }
            let (s, _) = self
                .changed
                .wait_timeout(state, Duration::from_millis(50))
                .unwrap_or_else(|p| p.into_inner());
            state = s;
        }
    }

    /// Takes `n` voters as [`Budget::take_in_turn`] does, but only if that can be done
    /// right now, whoever waits.
    #[cfg(test)]
    fn take(
        &self,
        rng: &mut fastrand::Rng,
        n: usize,
        eligible: impl Fn(usize) -> bool,
    ) -> Option<Vec<usize>> {
        Self::try_take(&mut self.lock(), self.max, rng, n, &eligible)
    }

    fn try_take(
        state: &mut State,
        max: usize,
        rng: &mut fastrand::Rng,
        n: usize,
        eligible: &impl Fn(usize) -> bool,
    ) -> Option<Vec<usize>> {
        let now = Instant::now();
        if state.exclusive || state.affected(now) + n > max {
            return None;
        }
        let mut free: Vec<usize> = (0..state.busy.len())
            .filter(|&i| eligible(i) && state.is_free(i, now))
            .collect();
        if free.len() < n {
            return None;
        }
        rng.shuffle(&mut free);
        free.truncate(n);
        for &i in &free {
            state.busy[i] = Busy::Held;
        }
        Some(free)
    }

    /// Gives voters back: healed.
    pub(super) fn free(&self, voters: &[usize]) {
        self.free_after(voters, Duration::ZERO);
    }

    /// Gives voters back, still affected for `d` (a restarted master's abstention, a
    /// promoted master's tenure protection).
    pub(super) fn free_after(&self, voters: &[usize], d: Duration) {
        let mut state = self.lock();
        let until = Instant::now() + d;
        for &i in voters {
            state.busy[i] = if d.is_zero() {
                Busy::Free
            } else {
                Busy::Until(until)
            };
        }
        drop(state);
        self.changed.notify_all();
    }

    /// Holds every voter for one scenario: from now on no lane takes any, and once none is
    /// affected any more (waited for until `within`, or until `stop`) the guard is
    /// returned; it gives them back when dropped. `None` when that did not happen in time.
    pub(super) fn exclusive(&self, stop: &Stop, within: Duration) -> Option<Exclusive<'_>> {
        let deadline = Instant::now() + within;
        let mut state = self.lock();
        state.exclusive = true;
        loop {
            let now = Instant::now();
            if state.affected(now) == 0 {
                return Some(Exclusive(self));
            }
            if now >= deadline || stop.is_set() {
                state.exclusive = false;
                drop(state);
                self.changed.notify_all();
                return None;
            }
            let (s, _) = self
                .changed
                .wait_timeout(state, Duration::from_millis(50))
                .unwrap_or_else(|p| p.into_inner());
            state = s;
        }
    }
}

/// Every voter held by one scenario (see [`Budget::exclusive`]).
#[derive(Debug)]
pub(super) struct Exclusive<'a>(&'a Budget);

impl Drop for Exclusive<'_> {
    fn drop(&mut self) {
        self.0.lock().exclusive = false;
        self.0.changed.notify_all();
    }
}

/// Tells every lane to heal what it injected and return.
#[derive(Debug, Default)]
pub(in crate::checker) struct Stop {
    stopped: Mutex<bool>,
    changed: Condvar,
}

impl Stop {
    pub(in crate::checker) fn set(&self) {
        *self.stopped.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.changed.notify_all();
    }

    pub(in crate::checker) fn is_set(&self) -> bool {
        *self.stopped.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits `d` unless told to stop first; true when told to stop.
    pub(in crate::checker) fn pause(&self, d: Duration) -> bool {
        let guard = self.stopped.lock().unwrap_or_else(|p| p.into_inner());
        let (guard, _) = self
            .changed
            .wait_timeout_while(guard, d, |stopped| !*stopped)
            .unwrap_or_else(|p| p.into_inner());
        *guard
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_never_lets_more_than_its_maximum_be_affected() {
        let budget = Budget::new(5, 2);
        let mut rng = fastrand::Rng::with_seed(7);
        let a = budget.take(&mut rng, 1, |_| true).unwrap();
        let b = budget.take(&mut rng, 1, |i| !a.contains(&i)).unwrap();
        assert!(budget.take(&mut rng, 1, |_| true).is_none(), "a third");
        budget.free_after(&a, Duration::from_secs(60));
        assert!(
            budget.take(&mut rng, 1, |_| true).is_none(),
            "a still abstains"
        );
        budget.free(&a);
        let two = budget.take(&mut rng, 2, |_| true);
        assert!(two.is_none(), "only one more fits: {two:?}");
        budget.free(&b);
        // Only voters the lane accepts.
        let only = budget.take(&mut rng, 2, |i| i >= 3).unwrap();
        assert!(only.iter().all(|&i| i >= 3), "{only:?}");
        budget.free(&only);

        // A scenario waits for every voter and holds them all.
        let stop = Stop::default();
        let c = budget.take(&mut rng, 1, |_| true).unwrap();
        assert!(budget
            .exclusive(&stop, Duration::from_millis(100))
            .is_none());
        budget.free(&c);
        let all = budget.exclusive(&stop, Duration::from_millis(100)).unwrap();
        assert!(
            budget.take(&mut rng, 1, |_| true).is_none(),
            "held by the scenario"
        );
        drop(all);
        assert!(budget.take(&mut rng, 1, |_| true).is_some());
    }

    /// Waits (bounded) until `n` lanes wait in the budget's queue.
    fn queued(budget: &Budget, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while budget.lock().queue.len() < n {
            assert!(Instant::now() < deadline, "{n} waiting lanes");
            std::thread::yield_now();
        }
    }

    #[test]
    fn lanes_waiting_for_room_take_their_turn_in_order() {
        let budget = Budget::new(5, 2);
        let stop = Stop::default();
        let mut rng = fastrand::Rng::with_seed(3);
        let held = budget.take(&mut rng, 2, |_| true).unwrap();
        let order = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            // The first waiter wants two voters, the second one: the second must not
            // overtake the first when one voter comes back.
            let first = s.spawn(|| {
                let mut rng = fastrand::Rng::with_seed(1);
                let v = budget.take_in_turn(&mut rng, 2, |_| true, &stop).unwrap();
                order.lock().unwrap().push("two");
                budget.free(&v);
            });
            queued(&budget, 1);
            let second = s.spawn(|| {
                let mut rng = fastrand::Rng::with_seed(2);
                let v = budget.take_in_turn(&mut rng, 1, |_| true, &stop).unwrap();
                order.lock().unwrap().push("one");
                budget.free(&v);
            });
            queued(&budget, 2);
            budget.free(&held[..1]);
            budget.free(&held[1..]);
            first.join().unwrap();
            second.join().unwrap();
        });
        assert_eq!(*order.lock().unwrap(), ["two", "one"]);

        // A waiter told to stop leaves the queue.
        let all = budget.take(&mut rng, 2, |_| true).unwrap();
        stop.set();
        assert!(budget.take_in_turn(&mut rng, 1, |_| true, &stop).is_none());
        assert!(budget.lock().queue.is_empty());
        budget.free(&all);
    }

    #[test]
    fn a_pause_ends_when_told_to_stop() {
        let stop = Stop::default();
        assert!(!stop.pause(Duration::from_millis(1)));
        std::thread::scope(|s| {
            s.spawn(|| stop.set());
            let started = Instant::now();
            assert!(stop.pause(Duration::from_secs(30)));
            assert!(started.elapsed() < Duration::from_secs(10));
        });
        assert!(stop.is_set());
    }
}
