//! The demo's fourth act: jobs that wait for jobs, through process kills. An edge device's
//! captures: each capture's clips are transcoded once it is done, and the bundle is uploaded
//! once, when every clip of its capture has been transcoded. The flow is data in the store: a
//! clip waits for its capture (`NewJob::after`), the clips are a group, and the upload is the
//! group's success callback. Three worker processes (this binary's `__pool`) run the queue;
//! two are killed with SIGKILL while they hold clips, and replaced.
//!
//! Wall time here is the demo's own pacing, never compared with store time.
#![allow(clippy::disallowed_methods)]

use std::path::Path;
use std::time::{Duration, Instant};

use leasehold::{
    Error, GroupId, JobFilter, JobId, JobState, NewGroup, NewJob, Outcome, Sharing, Store,
};
use leasehold::{JobStore, ReadJobs};

use super::helper::Helper;

const QUEUE: &str = "media";
const CAPTURES: usize = 3;
const CLIPS: usize = 8;
const PROCESSES: usize = 3;
const KILLS: usize = 2;

/// What the act measured.
pub(super) struct WorkflowAct {
    pub captures: usize,
    pub clips: usize,
    /// Clips with exactly one successful attempt.
    pub clips_once: usize,
    /// Bundles uploaded exactly once, each after its capture's last clip ended.
    pub uploads_once: usize,
    /// Processes killed while they held clips.
    pub killed: usize,
    pub failures: Vec<String>,
}

/// Runs the act in `dir`, narrating through `say`.
pub(super) fn act(dir: &Path, mut say: impl FnMut(String)) -> Result<WorkflowAct, Error> {
    let path = dir.join("workflow.redb");
    let store = Store::builder(&path)
        .sharing(Sharing::MultiProcess)
        .open()?;
    let mut flows: Vec<(JobId, GroupId, Vec<JobId>)> = Vec::new();
    for c in 0..CAPTURES {
        let capture = store.enqueue(NewJob::new(QUEUE, format!("capture-{c}")))?;
        let clips = (0..CLIPS)
            .map(|i| NewJob::new(QUEUE, format!("transcode capture-{c}/clip-{i}")).after(capture))
            .collect();
        let upload = NewGroup::new().on_success(NewJob::new(QUEUE, format!("upload bundle-{c}")));
        let (group, clips) = store.enqueue_group(upload, clips)?;
        flows.push((capture, group, clips));
    }
    let start = || {
        let args = [
            "__pool",
            "--queue",
            QUEUE,
            "--workers",
            "2",
            "--work-ms",
            "30",
        ];
        Helper::start(&path, &args)
    };
    let mut helpers = (0..PROCESSES)
        .map(|_| start())
        .collect::<Result<Vec<_>, _>>()?;
    say(format!(
        "act 4: {CAPTURES} captures, each with {CLIPS} clips to transcode once it is done and a \
         bundle to upload once every clip is: {PROCESSES} worker processes run them"
    ));
    let mut failures = Vec::new();
    let mut killed = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while killed < KILLS && Instant::now() < deadline {
        // A process that holds a clip right now is the one to kill.
        let running = store.jobs(&JobFilter {
            state: Some(JobState::Running),
            ..JobFilter::default()
        })?;
        let holding = running.iter().find(|j| j.group().is_some()).and_then(|j| {
            let owner = j.lease()?.owner().to_owned();
            helpers
                .iter()
                .position(|h| owner == format!("proc-{}", h.pid()))
        });
        match holding {
            Some(i) => {
                let victim = helpers.remove(i);
                let pid = victim.pid();
                victim.kill();
                killed += 1;
                say(format!(
                    "act 4: process {pid} is killed with SIGKILL while transcoding; a new one \
                     takes its place"
                ));
                helpers.push(start()?);
            }
            None => std::thread::sleep(Duration::from_millis(2)),
        }
    }
    let all = (CAPTURES * (CLIPS + 2)) as u64;
    while store.stats()?.total(JobState::Succeeded) < all && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    for h in helpers {
        h.end();
    }
    let succeeded_once = |id: JobId| -> Result<bool, Error> {
        let runs = store.history(id)?;
        Ok(runs
            .iter()
            .filter(|r| r.outcome() == Some(&Outcome::Succeeded))
            .count()
            == 1)
    };
    let (mut clips_once, mut uploads_once) = (0, 0);
    for (capture, group, clips) in &flows {
        let captured = store.job(*capture)?.and_then(|j| j.finished_at());
        for &clip in clips {
            let first = store.history(clip)?.first().map(|r| r.claimed_at());
            if first.is_none_or(|at| captured.is_none_or(|c| at < c)) {
                failures.push(format!(
                    "act 4: clip {clip} ran before its capture was done"
                ));
            }
            clips_once += usize::from(succeeded_once(clip)?);
        }
        let Some(record) = store.group(*group)? else {
            failures.push(format!("act 4: group {group} is gone"));
            continue;
        };
        let ended = record.finished_at();
        for &upload in record.waiters() {
            let first = store.history(upload)?.first().map(|r| r.claimed_at());
            let after = first.zip(ended).is_some_and(|(at, end)| at >= end);
            if after && succeeded_once(upload)? {
                uploads_once += 1;
            } else {
                failures.push(format!(
                    "act 4: bundle upload {upload} did not run exactly once after its last clip"
                ));
            }
        }
    }
    if killed < KILLS {
        failures.push(format!(
            "act 4: only {killed} of {KILLS} kills found a process holding a clip"
        ));
    }
    let act = WorkflowAct {
        captures: CAPTURES,
        clips: CAPTURES * CLIPS,
        clips_once,
        uploads_once,
        killed,
        failures,
    };
    say(format!(
        "act 4: {} of {} clips transcoded exactly once, {} of {} bundles uploaded exactly once, \
         each after its last clip, through {killed} kills",
        act.clips_once, act.clips, act.uploads_once, act.captures
    ));
    Ok(act)
}

impl WorkflowAct {
    /// Every invariant the act broke.
    pub(super) fn broken(&self) -> Vec<String> {
        let mut broken = self.failures.clone();
        if self.clips_once != self.clips || self.uploads_once != self.captures {
            broken.push(format!(
                "act 4: {} of {} clips and {} of {} uploads ran exactly once",
                self.clips_once, self.clips, self.uploads_once, self.captures
            ));
        }
        broken
    }

    pub(super) fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "captures": self.captures,
            "clips": self.clips,
            "clips_transcoded_exactly_once": self.clips_once,
            "bundles_uploaded_exactly_once": self.uploads_once,
            "processes_killed": self.killed,
        })
    }
}
