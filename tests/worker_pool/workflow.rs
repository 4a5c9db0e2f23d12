//! A handler in a workflow reads what it needs through its context, with no store handle of
//! its own.

use leasehold::{JobError, JobId, JobState, NewGroup, NewJob};

use crate::common::wait_until;
use crate::on_both::{Kind, Q};
use crate::pool;

crate::on_both::on_both!(
    a_handler_reads_its_dependencies_outputs_and_its_group_through_its_context,
);

/// A gathering job reads its dependencies' outputs in the order it named them; a member
/// reads its group; a callback reads the group it waits for, ended, with its counts.
fn a_handler_reads_its_dependencies_outputs_and_its_group_through_its_context(kind: Kind) {
    let f = kind.open();
    let deps: Vec<JobId> = ["p2", "p1"]
        .into_iter()
        .map(|p| f.enqueue(NewJob::new(Q, p)).unwrap())
        .collect();
    let gather = f
        .enqueue(NewJob::new(Q, "gather").after(deps[0]).after(deps[1]))
        .unwrap();
    let (group, members) = f
        .enqueue_group(
            NewGroup::new().on_complete(NewJob::new(Q, "callback")),
            vec![NewJob::new(Q, "member"), NewJob::new(Q, "member")],
        )
        .unwrap();
    let callback = f.group(group).unwrap().unwrap().waiters()[0];
    let failed = |e: leasehold::Error| JobError::permanent(e);
    let p = pool(&f, "a")
        .start(move |ctx| {
            let said = match ctx.payload() {
                b"gather" => {
                    let outputs = ctx.dependency_outputs().map_err(failed)?;
                    let each = outputs.iter().map(|(id, out)| {
                        let out = out.as_deref().map(String::from_utf8_lossy);
                        format!("{id}={}", out.unwrap_or_default())
                    });
                    each.collect::<Vec<_>>().join(",")
                }
                b"member" | b"callback" => match ctx.group().map_err(failed)? {
                    Some(g) => format!("group {} {:?} {:?}", g.id(), g.outcome(), g.ended()),
                    None => "no group".to_owned(),
                },
                other => format!("out-{}", String::from_utf8_lossy(other)),
            };
            Ok(said)
        })
        .unwrap();
    wait_until("every job to end", || {
        let ended = |id: JobId| f.job(id).unwrap().unwrap().state().is_terminal();
        [gather, callback].into_iter().all(ended)
    });
    drop(p);
    let output = |id: JobId| {
        let job = f.job(id).unwrap().unwrap();
        assert_eq!(job.state(), JobState::Succeeded, "job {id}: {:?}", job);
        String::from_utf8(f.output(id).unwrap().unwrap_or_default()).unwrap()
    };
    assert_eq!(
        output(gather),
        format!("{}=out-p2,{}=out-p1", deps[0], deps[1])
    );
    for member in members {
        assert!(
            output(member).starts_with(&format!("group {group} None ")),
            "a member runs before its group ends: {}",
            output(member)
        );
    }
    assert_eq!(
        output(callback),
        format!("group {group} Some(Succeeded) (2, 0, 0)")
    );
}
