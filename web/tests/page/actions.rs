//! The page's actions: nothing changes without the form secret and a confirmation, and
//! then the store's own operation runs (or its typed refusal comes back).

use http::StatusCode;
use leasehold::{JobState, NewJob};

use crate::on_both::{Kind, Q};
use crate::{expect, form_secret, get, page_of, post};

crate::on_both::on_both!(
    a_cancel_from_the_page_asks_first_then_reaches_the_store,
    a_running_job_cancelled_from_the_page_is_flagged_for_its_holder,
    a_dead_job_retried_from_the_page_runs_again_with_a_fresh_budget,
    a_refused_retry_answers_the_stores_error_and_changes_nothing,
    a_queue_paused_from_the_page_is_paused_in_the_store_until_resumed,
    a_page_without_a_writer_refuses_actions,
    every_dead_job_of_one_queue_is_retried_from_the_page_and_no_other,
    the_job_id_box_goes_to_that_job,
    a_delayed_job_run_now_from_the_page_is_due_unless_claimed_since_the_page_showed_it,
);

fn a_delayed_job_run_now_from_the_page_is_due_unless_claimed_since_the_page_showed_it(kind: Kind) {
    let f = kind.open();
    let later = std::time::Duration::from_secs(3600);
    let id = f.enqueue(NewJob::new(Q, "p").delay(later)).unwrap();
    let page = page_of(&f).build();
    let html = expect(get(&page, &format!("/jobs/{}", id.0)), StatusCode::OK);
    let secret = form_secret(&html);
    let promote = format!("/jobs/{}/promote?attempt=0", id.0);
    assert!(html.contains(&format!("action=\"{promote}\"")), "{html}");
    let question = expect(
        post(&page, &promote, &format!("csrf={secret}")),
        StatusCode::OK,
    );
    assert!(question.contains("Run job"), "{question}");
    assert!(
        f.claim(Q, "w", crate::on_both::lease()).unwrap().is_none(),
        "asking changes nothing"
    );
    let done = post(&page, &promote, &format!("csrf={secret}&confirm=yes"));
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    let l = f.claim_one("w");
    assert_eq!(l.job, id, "due now");
    f.fail(&l, "again later").unwrap();
    // The page showed attempt 0; the job has run since: refused, left as it is.
    let stale = post(&page, &promote, &format!("csrf={secret}&confirm=yes"));
    let refusal = expect(stale, StatusCode::CONFLICT);
    assert!(refusal.contains("claimed since"), "{refusal}");
    assert_eq!(f.job(id).unwrap().unwrap().state(), JobState::RetryWait);
    expect(
        post(
            &page,
            &format!("/jobs/{}/promote", id.0),
            &format!("csrf={secret}"),
        ),
        StatusCode::BAD_REQUEST,
    );
}

fn a_cancel_from_the_page_asks_first_then_reaches_the_store(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue(NewJob::new(Q, "p")).unwrap();
    let page = page_of(&f).build();
    let html = expect(get(&page, &format!("/jobs/{}", id.0)), StatusCode::OK);
    let secret = form_secret(&html);
    let cancel = format!("/jobs/{}/cancel", id.0);
    assert!(html.contains(&format!("action=\"{cancel}\"")));

    let question = expect(
        post(&page, &cancel, &format!("csrf={secret}")),
        StatusCode::OK,
    );
    assert!(question.contains("Cancel job"), "{question}");
    assert!(question.contains("name=\"confirm\" value=\"yes\""));
    assert_eq!(
        f.job(id).unwrap().unwrap().state(),
        JobState::Queued,
        "asking changes nothing"
    );

    let done = post(&page, &cancel, &format!("csrf={secret}&confirm=yes"));
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    let to = done.headers()["location"].to_str().unwrap().to_owned();
    assert_eq!(to, format!("/jobs/{}?did=cancelled", id.0));
    assert_eq!(f.job(id).unwrap().unwrap().state(), JobState::Cancelled);
    let after = expect(get(&page, &to), StatusCode::OK);
    assert!(after.contains("id=\"done\"") && after.contains("state cancelled"));
}

fn a_running_job_cancelled_from_the_page_is_flagged_for_its_holder(kind: Kind) {
    let f = kind.open();
    f.enqueue_n(1);
    let l = f.claim_one("w");
    let page = page_of(&f).build();
    let secret = form_secret(&expect(get(&page, "/"), StatusCode::OK));
    let done = post(
        &page,
        &format!("/jobs/{}/cancel", l.job.0),
        &format!("csrf={secret}&confirm=yes"),
    );
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    assert!(
        done.headers()["location"]
            .to_str()
            .unwrap()
            .ends_with("did=cancel_requested")
    );
    let job = f.job(l.job).unwrap().unwrap();
    assert_eq!(
        (job.state(), job.cancel_requested()),
        (JobState::Running, true)
    );
    assert_eq!(f.heartbeat(&l, 1).unwrap(), leasehold::Renewal::Cancelled);
}

fn a_dead_job_retried_from_the_page_runs_again_with_a_fresh_budget(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue(NewJob::new(Q, "p").max_attempts(1)).unwrap();
    let l = f.claim_one("w");
    assert_eq!(f.fail(&l, "boom").unwrap(), JobState::Dead);
    let page = page_of(&f).build();
    let html = expect(get(&page, &format!("/jobs/{}", id.0)), StatusCode::OK);
    assert!(html.contains("/retry\"") && !html.contains("/cancel\""));
    let secret = form_secret(&html);
    let done = post(
        &page,
        &format!("/jobs/{}/retry", id.0),
        &format!("csrf={secret}&confirm=yes"),
    );
    assert_eq!(
        done.status(),
        StatusCode::SEE_OTHER,
        "{}",
        crate::text(&done)
    );
    let job = f.job(id).unwrap().unwrap();
    assert_eq!((job.state(), job.failures()), (JobState::Queued, 0));
}

fn a_refused_retry_answers_the_stores_error_and_changes_nothing(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue(NewJob::new(Q, "p")).unwrap();
    let page = page_of(&f).build();
    let secret = form_secret(&expect(get(&page, "/"), StatusCode::OK));
    let before = f.job(id).unwrap().unwrap();
    let refused = expect(
        post(
            &page,
            &format!("/jobs/{}/retry", id.0),
            &format!("csrf={secret}&confirm=yes"),
        ),
        StatusCode::CONFLICT,
    );
    let store_says = f.retry(id).unwrap_err().to_string();
    assert!(
        refused.contains(&leasehold_escape(&store_says)),
        "the store's own words: {store_says} in {refused}"
    );
    let after = f.job(id).unwrap().unwrap();
    assert_eq!(
        (after.state(), after.updated_at()),
        (before.state(), before.updated_at())
    );
    expect(
        post(
            &page,
            "/jobs/999999/cancel",
            &format!("csrf={secret}&confirm=yes"),
        ),
        StatusCode::NOT_FOUND,
    );
}

fn leasehold_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

fn a_queue_paused_from_the_page_is_paused_in_the_store_until_resumed(kind: Kind) {
    let f = kind.open();
    f.enqueue_n(2);
    let page = page_of(&f).build();
    let html = expect(get(&page, "/"), StatusCode::OK);
    let secret = form_secret(&html);
    assert!(html.contains("action=\"/queues/q/pause\""));
    let done = post(
        &page,
        "/queues/q/pause",
        &format!("csrf={secret}&confirm=yes"),
    );
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    assert!(f.queue_settings(Q).unwrap().paused);
    assert!(f.claim(Q, "w", crate::on_both::lease()).unwrap().is_none());
    let html = expect(get(&page, "/?refresh=0"), StatusCode::OK);
    assert!(html.contains("action=\"/queues/q/resume\""));
    let done = post(
        &page,
        "/queues/q/resume",
        &format!("csrf={secret}&confirm=yes"),
    );
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    assert!(!f.queue_settings(Q).unwrap().paused);
}

fn a_page_without_a_writer_refuses_actions(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue(NewJob::new(Q, "p")).unwrap();
    let reads: std::sync::Arc<dyn leasehold::ReadJobs> = f.handle();
    let page = leasehold_web::StatusPage::builder(reads).build();
    let secret = form_secret(&expect(get(&page, "/"), StatusCode::OK));
    let refused = expect(
        post(
            &page,
            &format!("/jobs/{}/cancel", id.0),
            &format!("csrf={secret}&confirm=yes"),
        ),
        StatusCode::CONFLICT,
    );
    assert!(refused.contains("read-only"));
    assert_eq!(f.job(id).unwrap().unwrap().state(), JobState::Queued);
}

fn every_dead_job_of_one_queue_is_retried_from_the_page_and_no_other(kind: Kind) {
    let f = kind.open();
    for _ in 0..3 {
        f.enqueue(NewJob::new(Q, "p").max_attempts(1)).unwrap();
        let l = f.claim_one("w");
        assert_eq!(f.fail(&l, "boom").unwrap(), JobState::Dead);
    }
    let other = f.enqueue(NewJob::new("mail", "m").max_attempts(1)).unwrap();
    let l = f
        .claim("mail", "w", crate::on_both::lease())
        .unwrap()
        .unwrap();
    assert_eq!(f.fail(&l, "boom").unwrap(), JobState::Dead);

    let page = page_of(&f).build();
    let html = expect(get(&page, "/"), StatusCode::OK);
    let path = format!("/queues/{Q}/retry-dead");
    assert!(html.contains(&format!("action=\"{path}\"")), "{html}");
    assert!(html.contains("Retry 3 dead"), "{html}");
    let secret = form_secret(&html);
    let question = expect(
        post(&page, &path, &format!("csrf={secret}")),
        StatusCode::OK,
    );
    assert!(
        question.contains("Queue every dead job of queue"),
        "{question}"
    );
    assert_eq!(
        f.stats().unwrap().total(JobState::Dead),
        4,
        "asking changes nothing"
    );

    let done = post(&page, &path, &format!("csrf={secret}&confirm=yes"));
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    let to = done.headers()["location"].to_str().unwrap().to_owned();
    assert_eq!(to, "/?did=retried_dead&n=3&refused=0&refresh=0");
    let stats = f.stats().unwrap();
    assert_eq!(stats.queues[Q].get(JobState::Dead), 0);
    assert_eq!(stats.queues[Q].get(JobState::Queued), 3);
    assert_eq!(
        f.job(other).unwrap().unwrap().state(),
        JobState::Dead,
        "another queue's"
    );
    let after = expect(get(&page, &to), StatusCode::OK);
    assert!(after.contains("Queued 3 dead jobs again"), "{after}");
    expect(
        get(&page, "/?did=retried_dead&n=lots"),
        StatusCode::BAD_REQUEST,
    );
}

fn the_job_id_box_goes_to_that_job(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue(NewJob::new(Q, "p")).unwrap();
    let page = page_of(&f).build();
    let html = expect(get(&page, "/"), StatusCode::OK);
    assert!(
        html.contains("<form class=\"find\" method=\"get\" action=\"/jobs\"><input name=\"id\"")
    );
    let r = get(&page, &format!("/jobs?id=+{}+", id.0));
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(r.headers()["location"], format!("/jobs/{}", id.0).as_str());
    expect(get(&page, "/jobs?id=1%3Bdrop"), StatusCode::BAD_REQUEST);
    expect(get(&page, "/jobs/999999"), StatusCode::NOT_FOUND);
}
