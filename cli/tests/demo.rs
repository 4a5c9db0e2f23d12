//! The README's main command, run as a user would, with its defaults: `leasehold demo
//! --json`, its invariants read back from its report. (CI runs the demo only here.)

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::process::Command;

#[test]
fn the_demo_commits_every_job_exactly_once_through_kills_pauses_stalls_and_shutdowns() {
    let out = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["demo", "--json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("demo printed no JSON ({e}); stderr: {stderr}"));
    let n = |k: &str| {
        report[k]
            .as_u64()
            .unwrap_or_else(|| panic!("{k} missing: {report:#}"))
    };
    assert!(
        out.status.success(),
        "demo failed: {:#}",
        report["failures"]
    );
    assert_eq!(report["invariants_held"], true);
    // the default 300, and the job the story pauses and the one it hangs
    assert_eq!(n("jobs_enqueued"), 302);
    assert_eq!(n("succeeded"), 302);
    assert_eq!(n("committed_exactly_once"), n("jobs_enqueued"));
    assert_eq!(n("duplicate_commits"), 0);
    assert!(n("executions_ran_more_than_once") > 0);
    assert!(
        n("fenced_writes_rejected") >= 1,
        "the paused worker's late commit was refused"
    );
    assert!(n("stalled") >= 1, "the hung job was caught");
    let reclaims = &report["reclaims"];
    assert!(reclaims["reaper"].as_u64().unwrap() + reclaims["takeover"].as_u64().unwrap() >= 5);
    assert!(report["worst_detection_delay_ms"].as_f64().unwrap() > 0.0);
    assert_eq!(report["integrity_check_clean"], true);
    // act 2: a worker process killed while others go on
    let act = &report["processes"];
    assert_eq!(act["committed_exactly_once"], act["jobs"]);
    assert!(act["jobs_held_when_killed"].as_u64().unwrap() > 0);
    assert!(
        act["kill_to_claimable_ms"].as_f64().unwrap()
            < act["lease_plus_reaper_bound_ms"].as_f64().unwrap()
    );
    // act 3: a schedule in two processes, a limit across them
    let act = &report["schedules"];
    assert!(act["jobs"].as_u64().unwrap() >= 4);
    assert_eq!(act["distinct_ticks"], act["jobs"]);
    let fired: u64 = act["fired_by_each_scheduler"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(
        fired,
        act["jobs"].as_u64().unwrap(),
        "each tick fired by one scheduler"
    );
    assert!(act["most_held_at_once"].as_u64().unwrap() <= act["limit"].as_u64().unwrap());
    // act 4: captures, clips and bundle uploads through process kills
    let act = &report["workflow"];
    assert_eq!(act["clips_transcoded_exactly_once"], act["clips"]);
    assert_eq!(act["bundles_uploaded_exactly_once"], act["captures"]);
    assert!(act["processes_killed"].as_u64().unwrap() >= 1);
}
