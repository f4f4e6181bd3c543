//! A message decided: at once when the engine decides at once, else on its way, waiting while
//! its answer waits and it may still be admitted within its longest wait.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;

use super::admit::{Admitting, Answering, Asked, Opened, refused};
use super::limited::{Answer, Answers, Limited, OverLimit};
use super::message::{Direction, Message};

/// A decision on its way.
pub(super) type Deciding = Pin<Box<dyn Future<Output = Result<(), Limited>> + Send>>;

/// A message decided at once, or on its way.
pub(super) enum Decided {
    Now(Result<(), Limited>),
    Later(Deciding),
}

/// What came first: a refusal, or the layer's answer on its way.
enum First {
    Refused(Limited),
    Pending(Answering),
}

/// Decides `message`, a message of the connection `opened`, with `admitting`;
/// `answers` says what a policy over its limit answers. At once, nothing is cloned. A message
/// refused before its time (`Refusals`) is refused without a store call.
pub(super) fn decide(
    admitting: &Arc<dyn Admitting>,
    opened: &Arc<Opened>,
    message: Message,
    answers: &Arc<Answers>,
) -> Decided {
    let local = (opened.refused).local(
        message.direction,
        || admitting.now_us(),
        || admitting.policies_id(),
    );
    let asked = match local {
        Some(limited) => Asked::Now(Some(limited)),
        None => admitting.ask_message(opened, message),
    };
    let first = match asked {
        Asked::Now(None) => return Decided::Now(Ok(())),
        Asked::Now(Some(limited)) => {
            let answer = answers.of(&limited.policy);
            if wait_for(&limited, &answer, Duration::ZERO).is_none() {
                return Decided::Now(Err(refuse(admitting, opened, limited, answer)));
            }
            First::Refused(limited)
        }
        Asked::Later(answering) => First::Pending(answering),
    };
    let (admitting, opened, answers) = (admitting.clone(), opened.clone(), answers.clone());
    Decided::Later(Box::pin(async move {
        let direction = message.direction;
        let mut limited = match first {
            First::Refused(limited) => Some(limited),
            First::Pending(answering) => refused(&answering.await, direction),
        };
        let mut waited = Duration::ZERO;
        loop {
            let Some(refusal) = limited else {
                return Ok(());
            };
            let answer = answers.of(&refusal.policy);
            let Some(wait) = wait_for(&refusal, &answer, waited) else {
                return Err(refuse(&admitting, &opened, refusal, answer));
            };
            message_waited(&refusal.policy, wait);
            tokio::time::sleep(wait.max(Duration::from_millis(1))).await;
            waited += wait;
            limited = match admitting.ask_message(&opened, message) {
                Asked::Now(limited) => limited,
                Asked::Later(answering) => refused(&answering.await, direction),
            };
        }
    }))
}

/// How long `limited` waits before it is asked again, having `waited` already, when its
/// answer waits and it may be admitted within the answer's longest wait.
fn wait_for(limited: &Limited, over: &OverLimit, waited: Duration) -> Option<Duration> {
    let after = limited.retry_after?;
    let over_limit = limited.status == StatusCode::TOO_MANY_REQUESTS;
    (over_limit && waited + after <= over.wait).then_some(after)
}

/// `limited`, a message of `opened` refused, remembered to refuse the next ones locally until
/// its time, given its answer, and counted.
fn refuse(
    admitting: &Arc<dyn Admitting>,
    opened: &Opened,
    limited: Limited,
    over: OverLimit,
) -> Limited {
    (opened.refused).remember(&limited, admitting.now_us(), admitting.policies_id());
    answered(limited, over)
}

/// `limited` given its answer, and counted.
fn answered(mut limited: Limited, over: OverLimit) -> Limited {
    limited.answer = over.then;
    message_limited(&limited);
    limited
}

/// Counts a message refused (`ratelimit_messages_limited_total`).
fn message_limited(limited: &Limited) {
    let policy = match limited.policy() {
        "" => "none".to_owned(),
        name => name.to_owned(),
    };
    let direction = match limited.direction() {
        Direction::Inbound => "inbound",
        Direction::Outbound => "outbound",
    };
    let answer = match limited.answer() {
        Answer::Close(_) => "close",
        Answer::Error => "error",
    };
    metrics::counter!(
        "ratelimit_messages_limited_total",
        "policy" => policy,
        "direction" => direction,
        "answer" => answer
    )
    .increment(1);
}

/// Records a message's wait before it is decided again (`ratelimit_message_wait_seconds`).
fn message_waited(policy: &str, wait: std::time::Duration) {
    metrics::histogram!("ratelimit_message_wait_seconds", "policy" => policy.to_owned())
        .record(wait.as_secs_f64());
}
