//! Throughput and failures over the last minutes, from samples of the store's counts.
//!
//! The store keeps no time series (a counter bumped by every completion would be one hot
//! row every worker of a database writes), so the page keeps one: each request that finds
//! the latest sample a second old or more takes a new one from the counts the page reads
//! anyway. What finished between two samples is the growth of the terminal counts: jobs
//! succeeded, jobs dead. A purge shrinks them; an interval with a purge in it counts
//! nothing rather than a negative rate. The chart fills while someone watches (the overview
//! reloads itself, and a Prometheus scrape samples too) and costs nothing while nobody does.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write;
use std::time::Duration;

use leasehold::JobState;
use leasehold::Stats;
use leasehold::StoreTime;

/// How far back the chart looks.
pub(crate) const WINDOW: Duration = Duration::from_secs(15 * 60);
/// The least time between two samples.
const EVERY: Duration = Duration::from_secs(1);

/// Jobs finished so far, as a sample counts them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Finished {
    succeeded: u64,
    dead: u64,
}

#[derive(Clone, Debug)]
struct Sample {
    at: StoreTime,
    all: Finished,
    /// The same per queue.
    queues: BTreeMap<String, Finished>,
}

/// Jobs finished per second over an interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Rate {
    pub until: StoreTime,
    pub succeeded: f64,
    pub dead: f64,
}

#[derive(Default)]
pub(crate) struct Samples {
    samples: VecDeque<Sample>,
}

impl Samples {
    /// Records `stats` if the last sample is a second old or more (or the clock went back:
    /// another store).
    pub(crate) fn record(&mut self, stats: &Stats) {
        let at = stats.now;
        match self.samples.back() {
            Some(last) if last.at <= at && at.saturating_since(last.at) < EVERY => return,
            Some(last) if last.at > at => self.samples.clear(),
            _ => {}
        }
        let queues = stats
            .queues
            .iter()
            .map(|(name, q)| {
                let finished = Finished {
                    succeeded: q.get(JobState::Succeeded),
                    dead: q.get(JobState::Dead),
                };
                (name.clone(), finished)
            })
            .collect();
        self.samples.push_back(Sample {
            at,
            all: Finished {
                succeeded: stats.total(JobState::Succeeded),
                dead: stats.total(JobState::Dead),
            },
            queues,
        });
        while self
            .samples
            .front()
            .is_some_and(|f| at.saturating_since(f.at) > WINDOW)
        {
            self.samples.pop_front();
        }
    }

    /// The rate between each pair of samples, oldest first.
    pub(crate) fn rates(&self) -> Vec<Rate> {
        let s = &self.samples;
        s.iter()
            .zip(s.iter().skip(1))
            .map(|(a, b)| between((a.at, a.all), (b.at, b.all)))
            .collect()
    }

    /// The rates averaged over the last `span` (`None` until two samples that far apart).
    pub(crate) fn recent(&self, span: Duration) -> Option<Rate> {
        let (first, last) = self.span(span)?;
        Some(between((first.at, first.all), (last.at, last.all)))
    }

    /// Each queue's rates averaged over the last `span` (empty until two samples that far
    /// apart). A queue the first sample lacks had finished nothing then.
    pub(crate) fn recent_by_queue(&self, span: Duration) -> BTreeMap<String, Rate> {
        let Some((first, last)) = self.span(span) else {
            return BTreeMap::new();
        };
        last.queues
            .iter()
            .map(|(name, now)| {
                let then = first.queues.get(name).copied().unwrap_or_default();
                (name.clone(), between((first.at, then), (last.at, *now)))
            })
            .collect()
    }

    /// The oldest sample within `span` of the last, and the last, if they differ.
    fn span(&self, span: Duration) -> Option<(&Sample, &Sample)> {
        let last = self.samples.back()?;
        let first = self
            .samples
            .iter()
            .find(|s| last.at.saturating_since(s.at) <= span)?;
        (first.at != last.at).then_some((first, last))
    }
}

/// Jobs finished per second from a sample at `a` to a later one at `b`; nothing, rather
/// than a negative rate, where a purge shrank the counts between them.
fn between((from, a): (StoreTime, Finished), (until, b): (StoreTime, Finished)) -> Rate {
    let secs = until.saturating_since(from).as_secs_f64().max(1e-9);
    let purged = b.succeeded < a.succeeded || b.dead < a.dead;
    let growth = |x: u64, y: u64| match purged {
        true => 0.0,
        false => (y - x) as f64 / secs,
    };
    Rate {
        until,
        succeeded: growth(a.succeeded, b.succeeded),
        dead: growth(a.dead, b.dead),
    }
}

/// The rates as a small SVG chart: succeeded per second as a line, dead per second as a
/// second line, over the chart's window ending at `now`.
pub(crate) fn svg(rates: &[Rate], now: StoreTime) -> String {
    const W: f64 = 600.0;
    const H: f64 = 120.0;
    // A page just made has one sample, and a rate needs two: it says so rather than draw
    // an empty chart that reads as "nothing finished".
    let waiting = match rates.is_empty() {
        true => format!(
            "<text x=\"{}\" y=\"{}\" font-size=\"11\" fill=\"#6b7280\" \
             text-anchor=\"middle\">jobs finished per second show here once this page has \
             watched the store for a second or two (it reloads itself)</text>",
            W / 2.0,
            H / 2.0
        ),
        false => String::new(),
    };
    let top = rates
        .iter()
        .map(|r| r.succeeded.max(r.dead))
        .fold(1.0, f64::max);
    let x = |t: StoreTime| {
        let back = now.saturating_since(t).as_secs_f64();
        W - (back / WINDOW.as_secs_f64() * W)
    };
    let y = |v: f64| H - v / top * (H - 10.0);
    let line = |value: fn(&Rate) -> f64| {
        let mut points = String::new();
        for r in rates {
            let _ = write!(points, "{:.1},{:.1} ", x(r.until), y(value(r)));
        }
        points
    };
    format!(
        "<svg id=\"throughput\" viewBox=\"0 0 {W} {H}\" width=\"{W}\" height=\"{H}\" \
         role=\"img\" aria-label=\"jobs finished per second over the last 15 minutes\">\
         <text x=\"4\" y=\"12\" font-size=\"10\" fill=\"#6b7280\">{top:.1}/s</text>\
         <text x=\"4\" y=\"{H}\" font-size=\"10\" fill=\"#6b7280\" dy=\"-2\">-15 min</text>\
         <polyline fill=\"none\" stroke=\"#2a7\" stroke-width=\"1.5\" points=\"{ok}\"/>\
         <polyline fill=\"none\" stroke=\"#c22\" stroke-width=\"1.5\" points=\"{dead}\"/>\
         {waiting}</svg>",
        ok = line(|r| r.succeeded),
        dead = line(|r| r.dead),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold::QueueCounts;

    #[test]
    fn a_chart_with_no_rate_yet_says_it_is_waiting_for_a_second_sample() {
        let empty = svg(&[], StoreTime(1));
        assert!(
            empty.contains("once this page has watched the store"),
            "{empty}"
        );
        let rate = Rate {
            until: StoreTime(1),
            succeeded: 2.0,
            dead: 0.0,
        };
        assert!(!svg(&[rate], StoreTime(1)).contains("once this page"));
    }

    fn stats(at_secs: u64, succeeded: u64, dead: u64) -> Stats {
        let mut q = QueueCounts::default();
        q.by_state.insert(JobState::Succeeded, succeeded);
        q.by_state.insert(JobState::Dead, dead);
        let mut s = Stats::default();
        s.now = StoreTime(at_secs * 1_000_000_000);
        s.queues.insert("q".into(), q);
        s
    }

    #[test]
    fn rates_are_the_growth_of_the_terminal_counts_per_second() {
        let mut s = Samples::default();
        s.record(&stats(10, 0, 0));
        s.record(&stats(12, 100, 4));
        let r = s.rates();
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].succeeded, r[0].dead), (50.0, 2.0));
        assert_eq!(
            s.recent(Duration::from_secs(60)).map(|r| r.succeeded),
            Some(50.0)
        );
    }

    #[test]
    fn each_queue_has_its_own_rate_and_a_new_queue_counts_from_nothing() {
        let mut s = Samples::default();
        s.record(&stats(10, 0, 0));
        let mut later = stats(14, 40, 0);
        let mut other = QueueCounts::default();
        other.by_state.insert(JobState::Dead, 8);
        later.queues.insert("new".into(), other);
        s.record(&later);
        let by_queue = s.recent_by_queue(Duration::from_secs(60));
        assert_eq!(
            by_queue
                .iter()
                .map(|(q, r)| (q.as_str(), r.succeeded, r.dead))
                .collect::<Vec<_>>(),
            [("new", 0.0, 2.0), ("q", 10.0, 0.0)]
        );
        assert_eq!(s.recent(Duration::from_secs(60)).map(|r| r.dead), Some(2.0));
    }

    #[test]
    fn samples_closer_than_a_second_are_not_kept_and_old_ones_leave_the_window() {
        let mut s = Samples::default();
        s.record(&stats(10, 0, 0));
        s.record(&stats(10, 5, 0));
        assert_eq!(s.samples.len(), 1);
        s.record(&stats(10 + WINDOW.as_secs() + 5, 10, 0));
        assert_eq!(s.samples.len(), 1, "the first sample is out of the window");
    }

    #[test]
    fn a_purge_counts_as_nothing_finished_not_a_negative_rate() {
        let mut s = Samples::default();
        s.record(&stats(10, 1000, 0));
        s.record(&stats(11, 10, 0));
        s.record(&stats(12, 30, 0));
        let r = s.rates();
        assert_eq!(r[0].succeeded, 0.0);
        assert_eq!(r[1].succeeded, 20.0);
    }

    #[test]
    fn the_chart_draws_one_point_per_interval() {
        let mut s = Samples::default();
        for i in 0..5 {
            s.record(&stats(100 + i, i * 10, 0));
        }
        let svg = svg(&s.rates(), StoreTime(104 * 1_000_000_000));
        assert_eq!(svg.matches("polyline").count(), 2);
        let points = svg
            .split("points=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        assert_eq!(points.split_whitespace().count(), 4);
    }
}
