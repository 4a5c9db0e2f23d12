//! The queues one pool serves, and how its rounds' claims are shared among them: by weight
//! (a smooth weighted round-robin counted in jobs: each round asks the queue furthest
//! behind its share, so that 3:1 is three jobs of one for each of the other over the
//! rounds, and a round stays one claim), or in strict order (a queue is claimed from only
//! when every queue before it came up short).
//!
//! A queue a claim found short of work is *quiet*: no round asks it again until a commit
//! gives it work (its wake-up generation moves) or its next job or lease expiry falls due,
//! so an empty queue costs a pool's rounds no statement. What one queue cannot fill (empty,
//! paused, at its limit) the others take in the same round (`protocol::round_claim`).

use crate::error::{ConfigError, Result};
use crate::ids::StoreTime;
use crate::input;

/// The most queues one pool serves.
pub const MAX_POOL_QUEUES: usize = 64;

/// The queues a [`WorkerPool`](crate::WorkerPool) serves, sharing its workers and its
/// claim-ahead window: one (a queue's name converts into this), several by weight
/// (Sidekiq's weighted queues, River's and Oban's queue maps), or several in strict order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Queues {
    /// Each queue with its weight (1 for each in strict order).
    pub(crate) lanes: Vec<(String, u32)>,
    /// Claimed from in order, each only once those before it came up short.
    pub(crate) strict: bool,
}

impl Queues {
    /// Several queues sharing the pool by weight: of every `w1 + w2 + …` jobs the pool
    /// claims while all have work, `w1` are the first's, `w2` the second's, and so on. A
    /// queue without work, paused or at its limit leaves its share to the others.
    pub fn weighted<Q: Into<String>>(queues: impl IntoIterator<Item = (Q, u32)>) -> Queues {
        Queues {
            lanes: queues.into_iter().map(|(q, w)| (q.into(), w)).collect(),
            strict: false,
        }
    }

    /// Several queues in strict order: a job of a later queue is claimed only when every
    /// queue before it has none to give (empty, paused, at its limit).
    pub fn strict<Q: Into<String>>(queues: impl IntoIterator<Item = Q>) -> Queues {
        Queues {
            lanes: queues.into_iter().map(|q| (q.into(), 1)).collect(),
            strict: true,
        }
    }

    /// The queues' names, in the order given.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.lanes.iter().map(|(q, _)| q.as_str())
    }

    /// Every name checked, none twice, at least one and at most [`MAX_POOL_QUEUES`], every
    /// weight at least 1.
    pub(crate) fn check(&self) -> Result<()> {
        if self.lanes.is_empty() || self.lanes.len() > MAX_POOL_QUEUES {
            return Err(ConfigError::PoolQueues("a pool serves 1 to 64 queues").into());
        }
        for (i, (queue, weight)) in self.lanes.iter().enumerate() {
            input::check_queue(queue)?;
            if *weight == 0 {
                return Err(ConfigError::PoolQueues("a queue's weight must be at least 1").into());
            }
            if self.lanes[..i].iter().any(|(q, _)| q == queue) {
                return Err(ConfigError::PoolQueues("a queue is named twice").into());
            }
        }
        Ok(())
    }

    /// The name a pool goes by in its threads' names and its logs: its queues, joined.
    pub(crate) fn label(&self) -> String {
        self.names().collect::<Vec<_>>().join("+")
    }
}

impl From<&str> for Queues {
    fn from(queue: &str) -> Queues {
        Queues::weighted([(queue, 1)])
    }
}

impl From<String> for Queues {
    fn from(queue: String) -> Queues {
        Queues::weighted([(queue, 1)])
    }
}

impl From<&String> for Queues {
    fn from(queue: &String) -> Queues {
        Queues::from(queue.as_str())
    }
}

/// A dispatcher's state of its queues: each one's credit in the round-robin, and whether it
/// is quiet.
#[derive(Debug)]
pub(crate) struct Planner {
    lanes: Vec<Lane>,
    strict: bool,
    /// The weights of the queues open at the last plan: what a job costs a queue's credit.
    total: i64,
}

#[derive(Debug)]
struct Lane {
    queue: String,
    weight: i64,
    credit: i64,
    /// Quiet since the claim that found it short, at this wake-up generation, until this
    /// store time (its next due job or expiry, or the idle poll's bound).
    quiet: Option<(u64, StoreTime)>,
}

impl Planner {
    pub(crate) fn new(queues: &Queues) -> Planner {
        Planner {
            lanes: (queues.lanes.iter())
                .map(|(queue, weight)| Lane {
                    queue: queue.clone(),
                    weight: i64::from(*weight),
                    credit: 0,
                    quiet: None,
                })
                .collect(),
            strict: queues.strict,
            total: 0,
        }
    }

    /// Wakes the quiet queues whose generation moved (`generation` gives each one's now) or
    /// whose time has come.
    pub(crate) fn wake(&mut self, now: StoreTime, generation: impl Fn(&str) -> u64) {
        for lane in &mut self.lanes {
            if let Some((seen, until)) = lane.quiet
                && (now >= until || generation(&lane.queue) != seen)
            {
                lane.quiet = None;
            }
        }
    }

    /// Ends every queue's quiet: the next round asks them all.
    pub(crate) fn rouse(&mut self) {
        for lane in &mut self.lanes {
            lane.quiet = None;
        }
    }

    /// How `n` jobs are asked of the queues that are not quiet: all of them of one queue (the
    /// first open one in strict order; by weight, the one furthest behind its share of the
    /// jobs claimed so far, a smooth weighted round-robin counted in jobs), then of the
    /// others in their order, for what it could not give. One queue a round keeps a round
    /// one claim, as a pool of one queue makes; over rounds each queue's share of the jobs
    /// follows its weight. Empty when every queue is quiet.
    pub(crate) fn plan(&mut self, n: usize) -> Vec<(String, usize)> {
        let open: Vec<usize> = (0..self.lanes.len())
            .filter(|&i| self.lanes[i].quiet.is_none())
            .collect();
        let pick = match (self.strict, open.first()) {
            (_, None) => return Vec::new(),
            (true, Some(&first)) => first,
            (false, Some(&first)) => {
                let jobs = i64::try_from(n).unwrap_or(i64::MAX);
                let total: i64 = open.iter().map(|&i| self.lanes[i].weight).sum();
                self.total = total;
                for &i in &open {
                    let lane = &mut self.lanes[i];
                    lane.credit = lane.credit.saturating_add(lane.weight.saturating_mul(jobs));
                }
                let pick = (open.iter().copied())
                    .max_by_key(|&i| (self.lanes[i].credit, std::cmp::Reverse(i)))
                    .unwrap_or(first);
                let lane = &mut self.lanes[pick];
                lane.credit = lane.credit.saturating_sub(total.saturating_mul(jobs));
                pick
            }
        };
        let mut plan = vec![(self.lanes[pick].queue.clone(), n)];
        // What the one asked cannot give goes to the others in this order: in strict order
        // as given; by weight, the furthest behind its share first.
        let mut others: Vec<usize> = open.into_iter().filter(|&i| i != pick).collect();
        if !self.strict {
            others.sort_by_key(|&i| (std::cmp::Reverse(self.lanes[i].credit), i));
        }
        plan.extend(others.into_iter().map(|i| (self.lanes[i].queue.clone(), 0)));
        plan
    }

    /// A round asked `plan` and claimed `claimed` jobs of each queue (by name), `asked` in
    /// all: a queue that gave none of its share is quiet, and so is one that gave none when
    /// the round came up short (it was then asked for what was left), from `seen` (its
    /// generation read before the round) until `until` says. One that gave some but fewer
    /// (the last of its work, or jobs locked by a commit beside) is asked again.
    ///
    /// By weight, the round is settled as if only the queues that had work had been in it:
    /// one that gave nothing it was asked for (paused, empty, at its limit) gets back its
    /// credit of the round and what it was charged, and keeps none beyond (an idle queue
    /// saves no claim on the jobs to come); each other pays for the jobs it gave, at the
    /// weights of the queues that had work. So over the rounds the queues with work share
    /// the jobs by weight, however often one without work is asked first and its share
    /// taken by the others (the furthest behind first).
    pub(crate) fn claimed(
        &mut self,
        plan: &[(String, usize)],
        claimed: impl Fn(&str) -> usize,
        asked: usize,
        seen: impl Fn(&str) -> u64,
        until: impl Fn(&str) -> StoreTime,
    ) {
        let short = plan.iter().map(|(q, _)| claimed(q)).sum::<usize>() < asked;
        if !self.strict {
            let idle = |queue: &str, share: usize| claimed(queue) == 0 && (short || share > 0);
            let idle_weight: i64 = (plan.iter())
                .filter(|(q, share)| idle(q, *share))
                .filter_map(|(q, _)| self.lanes.iter().find(|l| l.queue == *q))
                .map(|l| l.weight)
                .sum();
            let working = self.total.saturating_sub(idle_weight);
            let jobs = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
            for (queue, share) in plan {
                let Some(lane) = self.lanes.iter_mut().find(|l| l.queue == *queue) else {
                    continue;
                };
                let charged = self.total.saturating_mul(jobs(*share));
                if idle(queue, *share) {
                    let accrued = lane.weight.saturating_mul(jobs(asked));
                    lane.credit = (lane.credit.saturating_add(charged))
                        .saturating_sub(accrued)
                        .min(0);
                } else {
                    let owed = working.saturating_mul(jobs(claimed(queue)));
                    lane.credit = lane.credit.saturating_add(charged).saturating_sub(owed);
                }
            }
        }
        for (queue, share) in plan {
            if claimed(queue) == 0
                && (short || *share > 0)
                && let Some(lane) = self.lanes.iter_mut().find(|l| l.queue == *queue)
            {
                lane.quiet = Some((seen(queue), until(queue)));
            }
        }
    }

    /// Keeps every queue quiet, each until `until` says (a new bound, its generation as it
    /// was), if `until` has one for each; `false` (and nothing changed) if one has none: a
    /// queue may have work, and the next round asks them all.
    pub(crate) fn stay_quiet(&mut self, until: impl Fn(&str) -> Option<StoreTime>) -> bool {
        let mut bounds = Vec::with_capacity(self.lanes.len());
        for lane in &self.lanes {
            match (lane.quiet, until(&lane.queue)) {
                (Some((seen, _)), Some(at)) => bounds.push((seen, at)),
                _ => return false,
            }
        }
        for (lane, bound) in self.lanes.iter_mut().zip(bounds) {
            lane.quiet = Some(bound);
        }
        true
    }

    /// The earliest time a quiet queue's wait ends, if any is quiet.
    pub(crate) fn next_wake(&self) -> Option<StoreTime> {
        self.lanes.iter().filter_map(|l| l.quiet.map(|q| q.1)).min()
    }

    /// What an idle wait compares: each quiet queue's generation when it went quiet, each
    /// other's as `seen` has it now.
    pub(crate) fn waits<'a>(&self, seen: &[(&'a str, u64)]) -> Vec<(&'a str, u64)> {
        seen.iter()
            .map(|&(queue, now)| {
                let lane = self.lanes.iter().find(|l| l.queue == queue);
                (queue, lane.and_then(|l| l.quiet).map_or(now, |q| q.0))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shares(p: &mut Planner, n: usize) -> Vec<usize> {
        let plan = p.plan(n);
        ["a", "b", "c"]
            .iter()
            .map(|q| plan.iter().find(|(x, _)| x == q).map_or(0, |(_, s)| *s))
            .collect()
    }

    #[test]
    fn weights_share_the_jobs_over_rounds_whatever_each_round_asks() {
        let q = Queues::weighted([("a", 3), ("b", 1)]);
        for n in [1, 8, 5] {
            let mut p = Planner::new(&q);
            let mut count = [0; 3];
            for _ in 0..40 {
                let s = shares(&mut p, n);
                assert_eq!(s.iter().filter(|&&x| x > 0).count(), 1, "one queue a round");
                for i in 0..3 {
                    count[i] += s[i];
                }
            }
            assert_eq!(count, [30 * n, 10 * n, 0], "{n} a round");
        }
        // the others follow, to take what the one asked could not give
        let mut p = Planner::new(&q);
        assert_eq!(p.plan(4), vec![("a".into(), 4), ("b".into(), 0)]);
    }

    #[test]
    fn strict_order_gives_the_first_open_queue_everything_and_lists_the_rest_to_fill() {
        let q = Queues::strict(["a", "b", "c"]);
        let mut p = Planner::new(&q);
        assert_eq!(
            p.plan(5),
            vec![("a".into(), 5), ("b".into(), 0), ("c".into(), 0)]
        );
    }

    #[test]
    fn a_queue_found_short_is_quiet_until_its_generation_moves_or_its_time_comes() {
        let q = Queues::weighted([("a", 1), ("b", 1), ("c", 1)]);
        let mut p = Planner::new(&q);
        let plan = p.plan(6);
        // a gave none, b its two and the two a left: the round filled, only a is quiet
        let got = |q: &str| match q {
            "a" => 0,
            "b" => 4,
            _ => 2,
        };
        p.claimed(&plan, got, 6, |_| 7, |_| StoreTime(100));
        assert!(p.plan(4).iter().all(|(q, _)| q != "a"), "a is quiet");
        p.wake(StoreTime(50), |q| if q == "a" { 8 } else { 7 });
        assert_eq!(p.plan(3).len(), 3, "a's generation moved");
        // a round that came up short: every queue that gave none is quiet, one that gave
        // some is asked again
        let plan = p.plan(6);
        p.claimed(
            &plan,
            |q| if q == "a" { 1 } else { 0 },
            6,
            |_| 8,
            |q| StoreTime(if q == "b" { 60 } else { 90 }),
        );
        assert_eq!(p.plan(4), vec![("a".to_owned(), 4)]);
        let plan = p.plan(4);
        p.claimed(&plan, |_| 0, 4, |_| 8, |_| StoreTime(90));
        assert!(p.plan(4).is_empty());
        assert_eq!(p.next_wake(), Some(StoreTime(60)));
        p.wake(StoreTime(60), |_| 8);
        assert_eq!(shares(&mut p, 2), [0, 2, 0], "b's time came");
    }

    #[test]
    fn a_round_that_fills_asks_nothing_quiet() {
        let q = Queues::weighted([("a", 1), ("b", 1)]);
        let mut p = Planner::new(&q);
        let plan = p.plan(4);
        p.claimed(
            &plan,
            |q| if q == "a" { 4 } else { 0 },
            4,
            |_| 0,
            |_| StoreTime(9),
        );
        assert_eq!(p.next_wake(), None);
        assert_eq!(shares(&mut p, 2), [0, 2, 0], "b's turn");
    }

    /// Of a, b and c at 3:1:2, c is paused (its jobs due, so it wakes at once and is asked
    /// again and again, giving nothing): each round's jobs go to the others, in their order,
    /// to a first. Charged to whoever took them, a and b still share 3:1 over the rounds
    /// (it came out 3.1 to 4.6 when the one asked paid for its round whoever took it).
    #[test]
    fn a_paused_queue_leaves_its_share_to_the_others_by_weight_not_to_the_first() {
        let q = Queues::weighted([("a", 3), ("b", 1), ("c", 2)]);
        for n in [1, 4, 7] {
            let mut p = Planner::new(&q);
            let mut count = [0usize; 3];
            for round in 0..4000u64 {
                p.wake(StoreTime(round), |_| 0);
                let plan = p.plan(n);
                // protocol::round_claim: each its share, then what is left in plan order
                let mut got = std::collections::BTreeMap::new();
                let mut left = 0;
                for (queue, share) in &plan {
                    let gives = if queue == "c" { 0 } else { *share };
                    left += share - gives;
                    got.insert(queue.clone(), gives);
                }
                for (queue, _) in &plan {
                    if queue != "c" && left > 0 {
                        *got.get_mut(queue).unwrap() += left;
                        left = 0;
                    }
                }
                for (i, name) in ["a", "b", "c"].iter().enumerate() {
                    count[i] += got.get(*name).copied().unwrap_or(0);
                }
                let of = |queue: &str| got.get(queue).copied().unwrap_or(0);
                p.claimed(&plan, of, n, |_| 0, |_| StoreTime(round + 1));
            }
            assert_eq!(count[2], 0);
            let ratio = count[0] as f64 / count[1] as f64;
            assert!(
                (2.95..=3.05).contains(&ratio),
                "{n} a round: {count:?}, a:b {ratio:.2}"
            );
        }
    }

    #[test]
    fn bad_queue_sets_are_refused() {
        assert!(
            Queues::weighted(Vec::<(String, u32)>::new())
                .check()
                .is_err()
        );
        assert!(Queues::weighted([("a", 0)]).check().is_err());
        assert!(Queues::weighted([("a", 1), ("a", 2)]).check().is_err());
        assert!(Queues::strict([""]).check().is_err());
        assert!(Queues::strict(["a", "b"]).check().is_ok());
    }
}
