//! What a request may ask, parsed and checked before anything reads the store: a job id, a
//! job listing's filters, a form's fields. Anything else is refused with a
//! [`WebError::BadRequest`] that names it; unknown parameters are refused too, so a typo in a
//! filter never silently lists everything.

use std::collections::BTreeMap;

use crate::WebError;
use leasehold::JobId;
use leasehold::JobState;
use leasehold::{JobFilter, JobOrder};

/// The most jobs one listing page shows.
pub(crate) const MAX_LIMIT: usize = 500;
/// The jobs a listing shows when it does not say.
pub(crate) const DEFAULT_LIMIT: usize = 50;
/// The most metadata conditions one listing takes.
const MAX_META_FILTERS: usize = 8;

/// The `name=value` pairs of a query string or a form body, in order.
pub(crate) fn pairs(text: &[u8]) -> Vec<(String, String)> {
    form_urlencoded::parse(text)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// A job id from a path segment.
pub(crate) fn job_id(segment: &str) -> Result<JobId, WebError> {
    segment
        .parse::<u64>()
        .ok()
        .filter(|&id| id > 0)
        .map(JobId)
        .ok_or_else(|| WebError::BadRequest(format!("{segment:?} is not a job id")))
}

/// An attempt from a parameter.
pub(crate) fn attempt(value: &str) -> Result<leasehold::Attempt, WebError> {
    (value.parse::<u32>().ok())
        .map(leasehold::Attempt)
        .ok_or_else(|| WebError::BadRequest(format!("{value:?} is not an attempt")))
}

/// A group id from a path segment.
pub(crate) fn group_id(segment: &str) -> Result<leasehold::GroupId, WebError> {
    segment
        .parse::<u64>()
        .ok()
        .filter(|&id| id > 0)
        .map(leasehold::GroupId)
        .ok_or_else(|| WebError::BadRequest(format!("{segment:?} is not a group id")))
}

/// A queue name from a path segment or a parameter, checked as the store checks one.
pub(crate) fn queue(name: &str) -> Result<String, WebError> {
    let named = JobFilter {
        queue: Some(name.to_owned()),
        ..JobFilter::default()
    };
    named
        .check()
        .map_err(|e| WebError::BadRequest(format!("queue: {e}")))?;
    Ok(name.to_owned())
}

/// A state by the name the page and the tool print.
pub(crate) fn state(name: &str) -> Result<JobState, WebError> {
    JobState::ALL
        .into_iter()
        .find(|s| s.name() == name)
        .ok_or_else(|| {
            WebError::BadRequest(format!(
                "state {name:?} is not one of {}",
                JobState::ALL.map(|s| s.name()).join(", ")
            ))
        })
}

/// The filters of the job listing, as the page links them: `queue`, `state`, `meta` (as
/// `key=value`, repeatable), `group` (a group's members), `after` (the last id of the
/// previous page), `limit`, `order` (`oldest` or `newest`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Listing {
    pub queue: Option<String>,
    pub state: Option<JobState>,
    pub meta: Vec<(String, String)>,
    pub group: Option<leasehold::GroupId>,
    pub after: Option<JobId>,
    pub limit: usize,
    pub newest_first: bool,
    /// A job asked for by its id (the search box): the page goes to it.
    pub id: Option<JobId>,
}

impl Listing {
    pub(crate) fn parse(query: &[(String, String)]) -> Result<Listing, WebError> {
        let mut l = Listing {
            limit: DEFAULT_LIMIT,
            ..Listing::default()
        };
        for (i, (k, v)) in query.iter().enumerate() {
            // Only `meta` may be given more than once: any other, repeated, would silently
            // take one of its values.
            if k != "meta" && query[..i].iter().any(|(seen, _)| seen == k) {
                return Err(twice(k));
            }
            if v.is_empty() {
                continue; // an empty field of the filter form: no condition
            }
            match k.as_str() {
                "queue" => l.queue = Some(queue(v)?),
                "state" => l.state = Some(state(v)?),
                "meta" => {
                    let Some((key, value)) = v.split_once('=') else {
                        return Err(WebError::BadRequest(format!("meta {v:?} is not key=value")));
                    };
                    l.meta.push((key.to_owned(), value.to_owned()));
                }
                "group" => l.group = Some(group_id(v)?),
                "after" => l.after = Some(job_id(v)?),
                "id" => l.id = Some(job_id(v.trim())?),
                "limit" => {
                    l.limit = v
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=MAX_LIMIT).contains(n))
                        .ok_or_else(|| {
                            WebError::BadRequest(format!(
                                "limit {v:?} is not a number from 1 to {MAX_LIMIT}"
                            ))
                        })?
                }
                "order" => {
                    l.newest_first = match v.as_str() {
                        "oldest" => false,
                        "newest" => true,
                        _ => {
                            return Err(WebError::BadRequest(format!(
                                "order {v:?} is not oldest or newest"
                            )));
                        }
                    }
                }
                _ => return Err(WebError::BadRequest(format!("unknown parameter {k:?}"))),
            }
        }
        if l.meta.len() > MAX_META_FILTERS {
            return Err(WebError::BadRequest(format!(
                "{} metadata conditions; at most {MAX_META_FILTERS}",
                l.meta.len()
            )));
        }
        let filtered = JobFilter {
            metadata: l.meta.clone(),
            ..JobFilter::default()
        };
        filtered
            .check()
            .map_err(|e| WebError::BadRequest(format!("meta: {e}")))?;
        Ok(l)
    }

    /// The store's filter for one page of the listing.
    pub(crate) fn filter(&self) -> JobFilter {
        JobFilter {
            queue: self.queue.clone(),
            state: self.state,
            limit: Some(self.limit),
            order: match self.newest_first {
                true => JobOrder::Newest,
                false => JobOrder::Oldest,
            },
            metadata: self.meta.clone(),
            after: self.after,
            group: self.group,
            ..JobFilter::default()
        }
    }

    /// The listing as a query string (without `after`, which the page adds per link).
    pub(crate) fn query(&self) -> String {
        let mut q = form_urlencoded::Serializer::new(String::new());
        if let Some(queue) = &self.queue {
            q.append_pair("queue", queue);
        }
        if let Some(state) = self.state {
            q.append_pair("state", state.name());
        }
        for (k, v) in &self.meta {
            q.append_pair("meta", &format!("{k}={v}"));
        }
        if let Some(group) = self.group {
            q.append_pair("group", &group.0.to_string());
        }
        if self.limit != DEFAULT_LIMIT {
            q.append_pair("limit", &self.limit.to_string());
        }
        if self.newest_first {
            q.append_pair("order", "newest");
        }
        q.finish()
    }
}

/// The parameters of a page that takes only `names`, by name; any other is refused by
/// name (a listing has its own reader, [`Listing::parse`]).
pub(crate) fn known<'a>(
    query: &'a [(String, String)],
    names: &[&str],
) -> Result<BTreeMap<&'a str, &'a str>, WebError> {
    let mut out = BTreeMap::new();
    for (k, v) in query {
        if !names.contains(&k.as_str()) {
            return Err(WebError::BadRequest(format!("unknown parameter {k:?}")));
        }
        if out.insert(k.as_str(), v.as_str()).is_some() {
            return Err(twice(k));
        }
    }
    Ok(out)
}

fn twice(name: &str) -> WebError {
    WebError::BadRequest(format!("parameter {name:?} is given more than once"))
}

/// A count given back to the page after an action (`n=12`).
pub(crate) fn count(name: &str, value: &str) -> Result<u64, WebError> {
    value
        .parse::<u64>()
        .map_err(|_| WebError::BadRequest(format!("{name} {value:?} is not a count")))
}

/// How often the overview reloads itself, in seconds: 0 (never) to 3600.
pub(crate) fn refresh(value: &str) -> Result<Option<u32>, WebError> {
    match value.parse::<u32>() {
        Ok(0) => Ok(None),
        Ok(n) if n <= 3600 => Ok(Some(n)),
        _ => Err(WebError::BadRequest(format!(
            "refresh {value:?} is not 0 to 3600"
        ))),
    }
}

/// The one value of form field `name`, required.
pub(crate) fn field<'a>(form: &'a [(String, String)], name: &str) -> Result<&'a str, WebError> {
    let mut values = form.iter().filter(|(k, _)| k == name);
    match (values.next(), values.next()) {
        (Some((_, v)), None) => Ok(v),
        (None, _) => Err(WebError::BadRequest(format!("the form has no {name}"))),
        (Some(_), Some(_)) => Err(WebError::BadRequest(format!("the form has {name} twice"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(q: &str) -> Result<Listing, WebError> {
        Listing::parse(&pairs(q.as_bytes()))
    }

    #[test]
    fn a_listing_reads_every_filter_and_writes_itself_back() {
        let l = parse("queue=mail&state=dead&meta=tenant%3Dacme&limit=20&order=newest&after=7")
            .unwrap();
        assert_eq!(l.queue.as_deref(), Some("mail"));
        assert_eq!(l.state, Some(JobState::Dead));
        assert_eq!(l.meta, vec![("tenant".to_owned(), "acme".to_owned())]);
        assert_eq!(
            (l.limit, l.newest_first, l.after),
            (20, true, Some(JobId(7)))
        );
        let again = parse(&l.query()).unwrap();
        assert_eq!(again, Listing { after: None, ..l });
    }

    #[test]
    fn malformed_filters_are_refused_by_name() {
        for bad in [
            "state=sleeping",
            "limit=0",
            "limit=501",
            "limit=many",
            "after=-1",
            "after=0",
            "meta=novalue",
            "colour=red",
            "order=sideways",
        ] {
            match parse(bad) {
                Err(WebError::BadRequest(_)) => {}
                other => panic!("{bad}: {other:?}"),
            }
        }
        let long_queue = format!("queue={}", "q".repeat(200));
        assert!(matches!(parse(&long_queue), Err(WebError::BadRequest(_))));
        let many = (0..9)
            .map(|i| format!("meta=k{i}%3Dv"))
            .collect::<Vec<_>>()
            .join("&");
        assert!(matches!(parse(&many), Err(WebError::BadRequest(_))));
    }

    #[test]
    fn empty_fields_of_the_filter_form_are_no_condition() {
        assert_eq!(parse("queue=&state=&meta=").unwrap().filter(), {
            let mut f = JobFilter {
                limit: Some(DEFAULT_LIMIT),
                ..JobFilter::default()
            };
            f.order = JobOrder::Oldest;
            f
        });
    }

    #[test]
    fn a_form_field_must_be_there_once() {
        let form = pairs(b"csrf=a&csrf=b&x=1");
        assert!(field(&form, "csrf").is_err());
        assert!(field(&form, "y").is_err());
        assert_eq!(field(&form, "x").unwrap(), "1");
    }
}
