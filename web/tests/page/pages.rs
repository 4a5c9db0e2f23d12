//! What the pages show, checked against what the store says.

use std::time::Duration;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::StatusCode;
use leasehold::{JobFilter, JobState, NewJob, ReadJobs};
use leasehold_web::StatusPage;

use crate::on_both::{Kind, Q};
use crate::{expect, get, page_of, shown_count};

crate::on_both::on_both!(
    the_overview_shows_each_queues_counts_as_the_store_counts_them,
    the_overview_lists_the_leases_held_with_their_worker_and_attempt,
    a_jobs_page_shows_its_run_history_attempt_by_attempt,
    the_job_list_filters_by_queue_state_and_metadata_and_pages_by_id,
    throughput_is_drawn_from_samples_of_the_finished_counts,
    a_page_under_a_prefix_links_under_it_and_finds_nothing_outside_it,
    a_slow_count_is_repeated_apart_from_the_requests_and_the_page_says_how_old_it_is,
    the_overview_shows_the_reapers_last_pass_and_warns_when_there_is_none_or_it_is_late,
    a_jobs_lease_timeline_draws_each_attempt_where_it_ran_and_the_held_lease_to_its_expiry,
    the_overview_lists_the_schedules_with_their_next_tick,
    counts_kept_a_while_are_aged_by_their_own_time_and_say_how_old_they_are,
    a_jobs_page_links_what_it_waits_for_and_a_groups_page_shows_its_progress,
    the_overview_shows_a_queues_limits_and_backoff_and_a_job_page_its_own_backoff_and_key,
);

fn the_overview_shows_a_queues_limits_and_backoff_and_a_job_page_its_own_backoff_and_key(
    kind: Kind,
) {
    let f = kind.open();
    let own = leasehold::RetryPolicy::delays([Duration::from_secs(1), Duration::from_secs(9)]);
    let id = (f.enqueue(
        NewJob::new(Q, "x")
            .retry_policy(own)
            .limit_key("tenant-<7>"),
    ))
    .unwrap();
    let page = page_of(&f).build();
    let settings = |html: &str| html.find("data-settings").map(|at| html[at..].to_owned());
    assert_eq!(settings(&expect(get(&page, "/"), StatusCode::OK)), None);
    f.declare_queue(Q).unwrap();
    f.set_queue_limits(Q, leasehold::QueueLimits::none().concurrency(2).per_key(1))
        .unwrap();
    let fixed = leasehold::RetryPolicy::fixed(Duration::from_secs(30)).jitter(0.5);
    f.set_queue_retry_policy(Q, Some(fixed)).unwrap();
    let shown = settings(&expect(get(&page, "/"), StatusCode::OK)).expect("settings shown");
    let shown = &shown[..shown.find("</small>").unwrap()];
    assert!(
        shown.contains("at most 2 held · at most 1 per limit key · backoff fixed 30s, jitter 50%"),
        "{shown}"
    );
    let job = expect(get(&page, &format!("/jobs/{}", id.0)), StatusCode::OK);
    assert!(job.contains("delays 1s, 9s"), "{job}");
    assert!(
        job.contains("tenant-&lt;7&gt;"),
        "the limit key, escaped: {job}"
    );
}

fn a_jobs_page_links_what_it_waits_for_and_a_groups_page_shows_its_progress(kind: Kind) {
    let f = kind.open();
    let capture = f.enqueue(NewJob::new(Q, "capture")).unwrap();
    let (group, clips) = f
        .enqueue_group(
            leasehold::NewGroup::new().on_success(NewJob::new("upload", "bundle")),
            vec![NewJob::new(Q, "clip").after(capture)],
        )
        .unwrap();
    let page = page_of(&f).build();
    let clip = expect(get(&page, &format!("/jobs/{}", clips[0].0)), StatusCode::OK);
    assert!(
        clip.contains(&format!(
            "<a href=\"/jobs/{capture}\">job {capture}</a> to end in success (not ended yet)"
        )),
        "{clip}"
    );
    assert!(
        clip.contains(&format!(
            "<a href=\"/groups/{}\">group {group}</a>",
            group.0
        )),
        "{clip}"
    );
    assert!(clip.contains("state blocked"), "{clip}");
    let dep = expect(get(&page, &format!("/jobs/{capture}")), StatusCode::OK);
    assert!(
        dep.contains("waited for by") && dep.contains(&format!("/jobs/{}", clips[0])),
        "{dep}"
    );
    let l = f.claim_one("w");
    f.complete(&l, b"").unwrap();
    let l = f.claim_one("w");
    f.complete(&l, b"").unwrap();
    let g = expect(get(&page, &format!("/groups/{}", group.0)), StatusCode::OK);
    assert!(g.contains("ended <span class=\"state succeeded\">"), "{g}");
    assert!(g.contains("<td>succeeded</td><td>1</td>"), "{g}");
    let members_link = format!("<a href=\"/jobs?group={}\">1</a>", group.0);
    assert!(g.contains(&members_link), "{g}");
    let members = expect(
        get(&page, &format!("/jobs?group={}", group.0)),
        StatusCode::OK,
    );
    let listed = |html: &str, id: leasehold::JobId| {
        html.contains(&format!("href=\"/jobs/{id}\"", id = id.0))
    };
    assert!(listed(&members, clips[0]), "{members}");
    assert!(!listed(&members, capture), "not a member: {members}");
    assert!(
        members.contains(&format!("name=\"group\" value=\"{}\"", group.0)),
        "the filter form keeps the group: {members}"
    );
    expect(get(&page, "/jobs?group=0"), StatusCode::BAD_REQUEST);
    let clip = expect(get(&page, &format!("/jobs/{}", clips[0].0)), StatusCode::OK);
    assert!(!clip.contains("checkpoint"), "none saved: {clip}");
    f.enqueue(NewJob::new(Q, "long")).unwrap();
    let l = f.claim_one("w");
    f.save_checkpoint(&l, b"frame 12").unwrap();
    f.log(&l, &["<b>frame</b> 12"]).unwrap();
    let saved = expect(get(&page, &format!("/jobs/{}", l.job.0)), StatusCode::OK);
    assert!(saved.contains("<h2>Log of attempt 1</h2>"), "{saved}");
    assert!(
        saved.contains("&lt;b&gt;frame&lt;/b&gt; 12"),
        "escaped: {saved}"
    );
    assert!(
        saved.contains("<td>checkpoint</td><td>8 bytes, saved by attempt 1"),
        "{saved}"
    );
    // A group in a group: each page links the other.
    let inner = (f.open_group(leasehold::NewGroup::new().in_group(group))).unwrap_err();
    assert!(
        matches!(inner, leasehold::Error::GroupSealed(_)),
        "{inner:?}"
    );
    let outer = f.open_group(leasehold::NewGroup::new()).unwrap();
    let inner = (f.open_group(leasehold::NewGroup::new().in_group(outer))).unwrap();
    let link = |g: leasehold::GroupId| format!("<a href=\"/groups/{}\">group {g}</a>", g.0);
    let o = expect(get(&page, &format!("/groups/{}", outer.0)), StatusCode::OK);
    assert!(
        o.contains(&format!("<td>group in it</td><td>{}", link(inner))),
        "{o}"
    );
    let i = expect(get(&page, &format!("/groups/{}", inner.0)), StatusCode::OK);
    assert!(
        i.contains(&format!("<td>member of</td><td>{}", link(outer))),
        "{i}"
    );
    expect(get(&page, "/groups/999"), StatusCode::NOT_FOUND);
    expect(get(&page, "/groups/x"), StatusCode::BAD_REQUEST);
}

fn the_overview_shows_each_queues_counts_as_the_store_counts_them(kind: Kind) {
    let f = kind.open();
    f.enqueue_n(5);
    f.enqueue(NewJob::new("mail", "m")).unwrap();
    let l = f.claim_one("w1");
    f.complete(&l, b"").unwrap();
    let l = f.claim_one("w1");
    f.fail(&l, "boom").unwrap();
    f.claim_one("w2");
    let page = page_of(&f).build();
    let html = expect(get(&page, "/"), StatusCode::OK);
    let stats = f.stats().unwrap();
    for (queue, counts) in &stats.queues {
        for state in JobState::ALL {
            assert_eq!(
                shown_count(&html, queue, state.name()),
                counts.get(state),
                "{queue}/{state}"
            );
        }
    }
    assert_eq!(shown_count(&html, Q, "succeeded"), 1);
    assert_eq!(shown_count(&html, Q, "running"), 1);
    assert_eq!(shown_count(&html, "mail", "queued"), 1);
    assert!(html.contains("<meta http-equiv=\"refresh\" content=\"5\">"));
    let still = expect(get(&page, "/?refresh=0"), StatusCode::OK);
    assert!(!still.contains("http-equiv=\"refresh\""));
}

fn the_overview_lists_the_leases_held_with_their_worker_and_attempt(kind: Kind) {
    let f = kind.open();
    f.enqueue_n(3);
    let held = f.claim_one("worker-<b>7</b>");
    let page = page_of(&f).build();
    let html = expect(get(&page, "/"), StatusCode::OK);
    let leases = &html[html.find("id=\"leases\"").expect("a leases table")..];
    let leases = &leases[..leases.find("</table>").unwrap()];
    assert!(leases.contains(&format!("/jobs/{}\"", held.job.0)));
    assert!(
        leases.contains("worker-&lt;b&gt;7&lt;/b&gt;"),
        "the worker's name, escaped: {leases}"
    );
    assert!(
        !html.contains("<b>7</b>"),
        "no markup from the store reaches the page"
    );
    assert_eq!(leases.matches("<tr>").count(), 2, "a heading and one lease");
}

fn a_jobs_page_shows_its_run_history_attempt_by_attempt(kind: Kind) {
    let f = kind.open();
    let id = f
        .enqueue(NewJob::new(Q, "p").metadata("tenant", "acme"))
        .unwrap();
    let l = f.claim_one("w1");
    f.fail(&l, "the <disk> is full").unwrap();
    f.advance(Duration::from_secs(3600));
    let l = f.claim_one("w2");
    f.advance(Duration::from_secs(2));
    f.complete(&l, b"ok").unwrap();
    let page = page_of(&f).build();
    let html = expect(get(&page, &format!("/jobs/{}", id.0)), StatusCode::OK);
    let runs = &html[html.find("id=\"runs\"").expect("a runs table")..];
    assert_eq!(
        runs.matches("<tr>").count(),
        3,
        "a heading and two attempts"
    );
    assert!(runs.contains("the &lt;disk&gt; is full"), "{runs}");
    assert!(runs.contains("succeeded"));
    assert!(runs.contains("w1") && runs.contains("w2"));
    assert!(html.contains("tenant") && html.contains("acme"));
    assert!(
        html.contains("2.0 s"),
        "the second attempt ran for two seconds of store time"
    );
    // A succeeded job offers neither cancel nor retry.
    assert!(!html.contains("/cancel\"") && !html.contains("/retry\""));
}

fn the_job_list_filters_by_queue_state_and_metadata_and_pages_by_id(kind: Kind) {
    let f = kind.open();
    let mut acme = Vec::new();
    for i in 0..7 {
        let tenant = if i % 2 == 0 { "acme" } else { "other" };
        let id = f
            .enqueue(NewJob::new(Q, "p").metadata("tenant", tenant))
            .unwrap();
        if tenant == "acme" {
            acme.push(id);
        }
    }
    f.enqueue(NewJob::new("mail", "m").metadata("tenant", "acme"))
        .unwrap();
    let page = page_of(&f).build();
    let ids_on = |html: &str| -> Vec<u64> {
        let table = match html.find("id=\"jobs\"") {
            Some(at) => &html[at..],
            None => return Vec::new(),
        };
        table
            .split("<a href=\"/jobs/")
            .skip(1)
            .map(|s| s[..s.find('"').unwrap()].parse().unwrap())
            .collect()
    };
    let first = expect(
        get(&page, "/jobs?queue=q&meta=tenant%3Dacme&limit=3"),
        StatusCode::OK,
    );
    assert_eq!(
        ids_on(&first),
        acme[..3].iter().map(|j| j.0).collect::<Vec<_>>()
    );
    let next = &first[first.find("id=\"next\" href=\"").expect("a next page") + 16..];
    let next = next[..next.find('"').unwrap()].replace("&amp;", "&");
    let second = expect(get(&page, &next), StatusCode::OK);
    assert_eq!(ids_on(&second), vec![acme[3].0]);
    let store_says: Vec<u64> = f
        .jobs(&JobFilter {
            state: Some(JobState::Queued),
            metadata: vec![("tenant".into(), "acme".into())],
            ..JobFilter::default()
        })
        .unwrap()
        .iter()
        .map(|j| j.id().0)
        .collect();
    let all = expect(
        get(&page, "/jobs?state=queued&meta=tenant%3Dacme"),
        StatusCode::OK,
    );
    assert_eq!(ids_on(&all), store_says);
    assert_eq!(store_says.len(), 5, "four in q and one in mail");
    // `meta` alone may repeat: every pair must hold
    let both = expect(
        get(&page, "/jobs?meta=tenant%3Dacme&meta=tenant%3Dother"),
        StatusCode::OK,
    );
    assert!(ids_on(&both).is_empty(), "no job carries both");
    let none = expect(get(&page, "/jobs?state=dead"), StatusCode::OK);
    assert!(ids_on(&none).is_empty() && none.contains("No job matches."));
}

fn throughput_is_drawn_from_samples_of_the_finished_counts(kind: Kind) {
    let f = kind.open();
    f.enqueue_n(30);
    f.enqueue(NewJob::new("mail", "m")).unwrap();
    let page = page_of(&f).build();
    expect(get(&page, "/"), StatusCode::OK);
    for _ in 0..20 {
        let l = f.claim_one("w");
        f.complete(&l, b"").unwrap();
    }
    for _ in 0..2 {
        let l = f.claim_one("w");
        f.fail_permanently(&l, "bad").unwrap();
    }
    f.advance(Duration::from_secs(10));
    let html = expect(get(&page, "/"), StatusCode::OK);
    let card = |id: &str| {
        let at = html.find(&format!("id=\"{id}\"><b>")).unwrap() + id.len() + 9;
        html[at..at + html[at..].find('<').unwrap()].to_owned()
    };
    assert_eq!(
        card("card-succeeded-rate"),
        "2.0/s",
        "20 in 10 s of store time"
    );
    assert_eq!(card("card-dead-rate"), "0.2/s");
    assert_eq!(card("card-failure-rate"), "9.1 %");
    assert!(html.contains("<svg id=\"throughput\""));
    // Each queue's own rate: all of it was the one queue's; the other finished nothing.
    assert!(
        html.contains(&format!("<span data-rate=\"{Q}\">2.0/s, 0.2/s died</span>")),
        "{html}"
    );
    assert!(
        html.contains("<span data-rate=\"mail\">0.0/s</span>"),
        "{html}"
    );
}

fn a_page_under_a_prefix_links_under_it_and_finds_nothing_outside_it(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue(NewJob::new(Q, "p")).unwrap();
    let page = page_of(&f).base_path("/ops/jobs/").build();
    let html = expect(get(&page, "/ops/jobs/"), StatusCode::OK);
    assert!(html.contains("href=\"/ops/jobs/jobs?queue=q\""));
    assert!(!html.contains("href=\"/jobs"));
    expect(
        get(&page, &format!("/ops/jobs/jobs/{}", id.0)),
        StatusCode::OK,
    );
    expect(get(&page, "/jobs"), StatusCode::NOT_FOUND);
    expect(get(&page, "/ops/jobsx"), StatusCode::NOT_FOUND);
}

/// A store whose counting takes 30 ms (as a database of many rows does), counting its counts.
struct SlowCounts {
    store: Arc<dyn ReadJobs>,
    counted: AtomicUsize,
}

macro_rules! delegate {
    ($($name:ident($($arg:ident: $t:ty),*) -> $r:ty;)*) => {
        $(fn $name(&self, $($arg: $t),*) -> leasehold::Result<$r> { self.store.$name($($arg),*) })*
    };
}

impl ReadJobs for SlowCounts {
    fn stats(&self) -> leasehold::Result<leasehold::Stats> {
        std::thread::sleep(Duration::from_millis(30));
        self.counted.fetch_add(1, Ordering::SeqCst);
        self.store.stats()
    }
    delegate! {
        now() -> leasehold::StoreTime;
        job(job: leasehold::JobId) -> Option<leasehold::Job>;
        history(job: leasehold::JobId) -> Vec<leasehold::Run>;
        payload(job: leasehold::JobId) -> Option<Vec<u8>>;
        output(job: leasehold::JobId) -> Option<Vec<u8>>;
        checkpoint(job: leasehold::JobId) -> Option<leasehold::Checkpoint>;
        logs(job: leasehold::JobId) -> Vec<leasehold::AttemptLog>;
        endings(after: leasehold::EndCursor, limit: usize) -> leasehold::Endings;
        group(group: leasehold::GroupId) -> Option<leasehold::Group>;
        waiters(job: leasehold::JobId) -> Vec<leasehold::JobId>;
        jobs(filter: &JobFilter) -> Vec<leasehold::Job>;
        timing(queue: &str) -> leasehold::QueueTiming;
        unserved_queues() -> Vec<leasehold::UnservedQueue>;
        queue_settings(queue: &str) -> leasehold::QueueSettings;
        schedules() -> Vec<leasehold::ScheduleInfo>;
        check() -> leasehold::CheckReport;
    }
}

fn a_slow_count_is_repeated_apart_from_the_requests_and_the_page_says_how_old_it_is(kind: Kind) {
    let f = kind.open();
    f.enqueue_n(2);
    let slow = Arc::new(SlowCounts {
        store: f.handle(),
        counted: AtomicUsize::new(0),
    });
    let page = StatusPage::builder(slow.clone())
        .counts_fresh_for(Duration::from_millis(1))
        .build();
    let first = expect(get(&page, "/?refresh=0"), StatusCode::OK);
    assert_eq!(shown_count(&first, Q, "queued"), 2);
    assert!(first.contains("counts taken now"));
    assert_eq!(slow.counted.load(Ordering::SeqCst), 1);
    f.enqueue_n(1);
    let (mut requests, mut stale_seen) = (0, false);
    crate::wait_until("the page to show the third job", || {
        let html = expect(get(&page, "/?refresh=0"), StatusCode::OK);
        requests += 1;
        stale_seen |= html.contains("counts as of");
        shown_count(&html, Q, "queued") == 3
    });
    assert!(
        stale_seen,
        "a page answered from the last count said how old it was"
    );
    let counted = slow.counted.load(Ordering::SeqCst);
    assert!(
        counted * 4 < requests.max(8),
        "{counted} counts for {requests} requests: a slow count is not repeated per request"
    );
}

fn the_overview_shows_the_reapers_last_pass_and_warns_when_there_is_none_or_it_is_late(kind: Kind) {
    let f = kind.open();
    f.enqueue_n(2);
    f.claim_one("silent");
    let page = page_of(&f).build();
    let html = expect(get(&page, "/"), StatusCode::OK);
    assert!(
        html.contains("<p class=\"error\" id=\"reaper\">No reaper pass is recorded"),
        "{html}"
    );

    f.advance(crate::on_both::LEASE);
    f.reap().unwrap();
    f.advance(Duration::from_secs(5));
    let html = expect(get(&page, "/"), StatusCode::OK);
    assert!(
        html.contains(
            "<p class=\"note\" id=\"reaper\">The reaper's last pass ended 5.0 s ago: it took \
             0 ms; leases taken back: 1; finished jobs purged: 0.</p>"
        ),
        "{html}"
    );
    assert!(html.contains("<div class=\"card\" id=\"card-reaper\"><b>5.0 s</b>"));

    // A reaper thread's pass carries its interval; once it stops, the page says it is late.
    let every = Duration::from_millis(5);
    let mut reaper = f.start_reaper(every).unwrap();
    crate::wait_until("the reaper thread to record a pass", || {
        f.stats()
            .unwrap()
            .last_reaper_pass
            .is_some_and(|p| p.every == Some(every))
    });
    reaper.stop();
    let html = expect(get(&page, "/"), StatusCode::OK);
    assert!(html.contains("(it runs every 5 ms)"), "{html}");
    assert!(!html.contains("missed passes"), "{html}");
    f.advance(Duration::from_secs(1));
    let html = expect(get(&page, "/"), StatusCode::OK);
    assert!(
        html.contains("It has missed passes since: is its process running?</p>"),
        "{html}"
    );
}

fn a_jobs_lease_timeline_draws_each_attempt_where_it_ran_and_the_held_lease_to_its_expiry(
    kind: Kind,
) {
    let f = kind.open();
    let id = f.enqueue(NewJob::new(Q, "p")).unwrap();
    let page = page_of(&f).build();
    let html = expect(get(&page, &format!("/jobs/{}", id.0)), StatusCode::OK);
    assert!(
        !html.contains("id=\"timeline\""),
        "never claimed: nothing to draw"
    );

    // Attempt 1 from 0 s to its reclaim at 60 s; the job waits 10 s; attempt 2 claimed at
    // 70 s runs at 75 s (now), its lease held to 130 s: the axis spans 130 s over 600 units.
    assert_eq!(crate::on_both::LEASE, Duration::from_secs(60));
    f.claim_one("w1");
    f.advance(crate::on_both::LEASE);
    assert_eq!(f.reap().unwrap().reclaimed.len(), 1);
    f.advance(Duration::from_secs(10));
    f.claim_one("w<2>");
    f.advance(Duration::from_secs(5));
    let html = expect(get(&page, &format!("/jobs/{}", id.0)), StatusCode::OK);
    let svg = &html[html.find("<svg id=\"timeline\"").expect("a timeline")..];
    let svg = &svg[..svg.find("</svg>").unwrap()];
    assert!(
        svg.contains("<rect class=\"run lost\" x=\"0.0\" y=\"16.0\" width=\"276.9\""),
        "{svg}"
    );
    assert!(
        svg.contains("<rect class=\"run running\" x=\"323.1\" y=\"32.0\" width=\"23.1\""),
        "{svg}"
    );
    assert!(
        svg.contains("<line class=\"lease\" x1=\"346.2\" y1=\"38.0\" x2=\"600.0\""),
        "{svg}"
    );
    assert!(svg.contains("lease expires in 55.0 s"), "{svg}");
    assert!(
        svg.contains("attempt 2 by w&lt;2&gt;: 5.0 s, running"),
        "{svg}"
    );
    assert!(!svg.contains("w<2>"), "the worker's name is escaped");
}

/// Counts kept a while (a database that counts slowly) are aged by their own time: a
/// lease that had not run out when they were taken is not shown overdue against a later
/// now (the page once showed red "overdue" warnings that `stats` at the same moment did
/// not), and the page says how old they are.
fn counts_kept_a_while_are_aged_by_their_own_time_and_say_how_old_they_are(kind: Kind) {
    let f = kind.open();
    f.enqueue_n(1);
    let lease = f.claim_one("w");
    let page = page_of(&f)
        .counts_fresh_for(Duration::from_secs(3600))
        .build();
    let first = expect(get(&page, "/"), StatusCode::OK);
    assert!(first.contains("counts taken now"), "{first}");
    f.advance(lease.expires_at.saturating_since(f.now()) + Duration::from_secs(60));
    let later = expect(get(&page, "/"), StatusCode::OK);
    let queues = &later[later.find("id=\"queues\"").unwrap()..];
    let queues = &queues[..queues.find("</table>").unwrap()];
    assert!(
        !queues.contains("by 1 min"),
        "overdue against a later now: {queues}"
    );
    let as_of = &later[later.find("id=\"as-of\"").unwrap()..];
    assert!(as_of.contains("as of 2 min 0 s ago"), "{as_of}");
    // a database's store time is its clock, read as a date; a file's, from its start
    let footer = &as_of[..as_of.find("</p>").unwrap()];
    assert_eq!(f.is_postgres(), footer.contains(" UTC;"), "{footer}");
    assert_eq!(
        !f.is_postgres(),
        footer.contains("Store time t+"),
        "{footer}"
    );
}

fn the_overview_lists_the_schedules_with_their_next_tick(kind: Kind) {
    let f = kind.open();
    let page = page_of(&f).build();
    let html = expect(get(&page, "/"), StatusCode::OK);
    assert!(!html.contains("id=\"schedules\""), "no schedules, no table");

    let every = Duration::from_secs(300);
    f.declare_schedule(leasehold::Schedule::every(
        "nightly<1>",
        every,
        NewJob::new(Q, "s"),
    ))
    .unwrap();
    let next_in = |html: &str| {
        let table = &html[html.find("id=\"schedules\"").expect("a schedules table")..];
        let row = &table[table
            .find("nightly&lt;1&gt;")
            .expect("the schedule, escaped")..];
        row[..row.find("</tr>").unwrap()].to_owned()
    };
    let row = next_in(&expect(get(&page, "/"), StatusCode::OK));
    assert!(row.contains("every 5 min 0 s"), "{row}");
    assert!(row.contains("<td>in 5 min 0 s</td>"), "{row}");

    f.advance(every + Duration::from_secs(60));
    let row = next_in(&expect(get(&page, "/"), StatusCode::OK));
    assert!(
        row.contains("<td>due 1 min 0 s ago</td>"),
        "no scheduler fired it: {row}"
    );
    f.pause_schedule("nightly<1>").unwrap();
    let row = next_in(&expect(get(&page, "/"), StatusCode::OK));
    assert!(row.contains("paused"), "{row}");
}
