//! Typed payloads and outputs as JSON (the `serde` feature).

use std::collections::HashMap;

use leasehold::{Error, InputError, JobState, NewJob, Output};
use serde::{Deserialize, Serialize};

use crate::common::wait_until;
use crate::on_both::{Kind, Q, lease};
use crate::pool;

crate::on_both::on_both!(
    a_job_enqueued_as_json_reaches_its_handler_typed_and_its_output_reads_back,
    a_payload_that_is_not_the_json_of_the_type_fails_the_job_for_good_naming_the_type,
    a_claim_loop_reads_the_payload_typed_and_a_foreign_payload_is_an_input_error,
    a_value_json_cannot_hold_is_refused_before_anything_is_enqueued,
);

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Photo {
    path: String,
    width: u32,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Thumbnail {
    path: String,
    width: u32,
}

fn a_job_enqueued_as_json_reaches_its_handler_typed_and_its_output_reads_back(kind: Kind) {
    let f = kind.open();
    let photo = Photo {
        path: "photo-1.jpg".into(),
        width: 4000,
    };
    let id = f.enqueue(NewJob::json(Q, &photo).unwrap()).unwrap();
    let p = pool(&f, "w")
        .start(|ctx| {
            let photo: Photo = ctx.json()?;
            Output::json(&Thumbnail {
                path: photo.path.replace(".jpg", ".thumb.jpg"),
                width: photo.width / 10,
            })
        })
        .unwrap();
    wait_until("the job to succeed", || p.stats().succeeded == 1);
    let output: Thumbnail = serde_json::from_slice(&f.output(id).unwrap().unwrap()).unwrap();
    assert_eq!(
        output,
        Thumbnail {
            path: "photo-1.thumb.jpg".into(),
            width: 400
        }
    );
    // to the rest of leasehold it is an ordinary payload: readable JSON bytes
    let stored: Photo = serde_json::from_slice(&f.payload(id).unwrap().unwrap()).unwrap();
    assert_eq!(stored, photo);
}

fn a_payload_that_is_not_the_json_of_the_type_fails_the_job_for_good_naming_the_type(kind: Kind) {
    let f = kind.open();
    let id = f
        .enqueue(NewJob::new(Q, "{\"path\": 7}").max_attempts(25))
        .unwrap();
    let p = pool(&f, "w")
        .start(|ctx| {
            let photo: Photo = ctx.json()?;
            Ok(photo.path)
        })
        .unwrap();
    wait_until("the attempt to fail", || p.stats().failed == 1);
    // this build would read it the same way every time: dead at once, the budget unspent
    let job = f.job(id).unwrap().unwrap();
    assert_eq!((job.state(), job.failures()), (JobState::Dead, 1));
    let error = job.last_error().unwrap();
    assert!(
        error.starts_with("payload is not the JSON of ") && error.contains("Photo"),
        "{error}"
    );
}

fn a_claim_loop_reads_the_payload_typed_and_a_foreign_payload_is_an_input_error(kind: Kind) {
    let f = kind.open();
    let photo = Photo {
        path: "a.jpg".into(),
        width: 1,
    };
    f.enqueue(NewJob::json(Q, &photo).unwrap()).unwrap();
    f.enqueue(NewJob::new(Q, vec![0xff, 0x00])).unwrap();
    let typed = f.claim(Q, "w", lease()).unwrap().unwrap();
    assert_eq!(typed.json::<Photo>().unwrap(), photo);
    let foreign = f.claim(Q, "w", lease()).unwrap().unwrap();
    assert!(matches!(
        foreign.json::<Photo>(),
        Err(Error::Input(InputError::Json(_)))
    ));
}

fn a_value_json_cannot_hold_is_refused_before_anything_is_enqueued(kind: Kind) {
    let f = kind.open();
    // JSON object keys are strings: a map keyed by pairs has no JSON form
    let value: HashMap<(u8, u8), u8> = HashMap::from([((1, 2), 3)]);
    assert!(matches!(
        NewJob::json(Q, &value),
        Err(Error::Input(InputError::Json(_)))
    ));
    assert_eq!(f.stats().unwrap().total(JobState::Queued), 0);
}
