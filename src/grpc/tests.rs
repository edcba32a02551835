//! The gRPC mapping: codes, content types, trailers-only answers, replay judgment.

use super::*;
use crate::key::{KeyRejection, KeySource};
use crate::rejection::ProblemJson;
use std::time::Duration;

fn grpc(r: Rejection) -> Rejection {
    r.on(Wire::Grpc)
}

fn header<'a>(res: &'a RejectionResponse, name: &str) -> Option<&'a str> {
    res.headers().find(|(n, _)| *n == name).map(|(_, v)| v)
}

#[test]
fn codes_round_trip_and_name_themselves() {
    for (i, code) in CODES.iter().enumerate() {
        assert_eq!(code.value(), i as i32);
        assert_eq!(GrpcCode::from_value(code.value()), Some(*code));
        assert_eq!(
            GrpcCode::parse(code.value().to_string().as_bytes()),
            Some(*code)
        );
    }
    assert_eq!(GrpcCode::from_value(-1), None);
    assert_eq!(GrpcCode::parse(b"x"), None);
    assert_eq!(GrpcCode::AlreadyExists.to_string(), "ALREADY_EXISTS");
}

#[test]
fn grpc_content_types_are_detected() {
    for ct in [
        "application/grpc",
        "application/grpc+proto",
        "application/grpc;charset=utf-8",
        "APPLICATION/GRPC+json",
        " application/grpc",
    ] {
        assert_eq!(Wire::of_content_type(ct.as_bytes()), Wire::Grpc, "{ct}");
    }
    assert_eq!(
        Wire::of_content_type(b"application/grpc-web+proto"),
        Wire::GrpcWeb
    );
    assert_eq!(
        Wire::of_content_type(b"application/grpc-web-text"),
        Wire::GrpcWebText
    );
    for ct in [
        "",
        "application/json",
        "application/grpcx",
        "application/grpc-webx",
        "application/grpc-web-textual",
        "application/grp",
        "text/application/grpc",
    ] {
        assert!(!is_grpc(ct), "{ct}");
    }
}

#[test]
fn every_kind_has_its_code() {
    let replay = |kind| grpc(Rejection::replay(kind)).grpc_code();
    assert_eq!(
        replay(RejectionKind::Mismatch),
        GrpcCode::FailedPrecondition
    );
    assert_eq!(
        replay(RejectionKind::BodyTooLarge),
        GrpcCode::ResourceExhausted
    );
    assert_eq!(replay(RejectionKind::BodyUnreadable), GrpcCode::Cancelled);
    assert_eq!(
        replay(RejectionKind::CompletedNotStored),
        GrpcCode::AlreadyExists
    );
    let key = Rejection::bad_key(KeyRejection::missing(KeySource::header("idempotency-key")));
    assert_eq!(key.grpc_code(), GrpcCode::InvalidArgument);
    let lock = |e| Rejection::from_lock_error(e, Duration::from_secs(2)).grpc_code();
    let held = crate::Error::contended(1, 0, 1, Some(Duration::from_millis(1500)), Vec::new());
    assert_eq!(lock(held), GrpcCode::Aborted);
    assert_eq!(lock(crate::Error::invalid("ttl")), GrpcCode::Internal);
}

#[test]
fn a_grpc_status_is_trailers_only_with_the_retry_hint() {
    let held = crate::Error::contended(1, 0, 1, Some(Duration::from_millis(1500)), Vec::new());
    let r = grpc(Rejection::from_lock_error(held, Duration::from_secs(1)));
    assert!(r.is_grpc());
    let res = GrpcOr(ProblemJson).respond(&r);
    assert_eq!(
        (res.status(), res.content_type()),
        (200, "application/grpc")
    );
    assert!(res.body().is_empty());
    assert_eq!(header(&res, "grpc-status"), Some("10"));
    assert_eq!(res.retry_after(), Some(2));
    assert_eq!(header(&res, "grpc-retry-pushback-ms"), Some("1500"));
    let message = header(&res, "grpc-message").unwrap();
    assert!(
        message.starts_with("another request with the same key"),
        "{message}"
    );

    // No hint for a bad key; the same rejection over HTTP is problem+json.
    let key = KeyRejection::missing(KeySource::header("idempotency-key"));
    let res = GrpcOr(ProblemJson).respond(&grpc(Rejection::bad_key(key.clone())));
    assert_eq!(header(&res, "grpc-status"), Some("3"));
    assert_eq!(
        (res.retry_after(), header(&res, "grpc-retry-pushback-ms")),
        (None, None)
    );
    let http = GrpcOr(ProblemJson).respond(&Rejection::bad_key(key));
    assert_eq!(
        (http.status(), http.content_type()),
        (400, "application/problem+json")
    );

    let web = Rejection::replay(RejectionKind::Mismatch).on(Wire::GrpcWebText);
    assert_eq!(
        web.to_grpc_status().content_type(),
        "application/grpc-web-text"
    );
}

#[test]
fn pushback_is_the_delay_in_milliseconds_rounded_up() {
    let hint = |retry: Duration| {
        let held = crate::Error::contended(1, 0, 1, Some(retry), Vec::new());
        let res = grpc(Rejection::from_lock_error(held, Duration::from_secs(1))).to_grpc_status();
        let ms = header(&res, "grpc-retry-pushback-ms").map(str::to_owned);
        (res.retry_after(), ms)
    };
    let expect = |secs: u64, ms: &str| (Some(secs), Some(ms.to_owned()));
    assert_eq!(hint(Duration::ZERO), expect(1, "1"));
    assert_eq!(hint(Duration::from_micros(1)), expect(1, "1"));
    assert_eq!(hint(Duration::from_millis(1)), expect(1, "1"));
    assert_eq!(hint(Duration::from_micros(1_000_400)), expect(2, "1001"));
    assert_eq!(hint(Duration::from_millis(1500)), expect(2, "1500"));
    assert_eq!(hint(Duration::from_millis(2000)), expect(2, "2000"));
    assert_eq!(hint(Duration::from_millis(29_400)), expect(30, "29400"));
    // An unreachable quorum: the policy's delay.
    let down = crate::Error::unavailable("no quorum", Vec::new());
    let res = grpc(Rejection::from_lock_error(down, Duration::from_millis(250))).to_grpc_status();
    assert_eq!(header(&res, "grpc-status"), Some("14"));
    assert_eq!(
        (res.retry_after(), header(&res, "grpc-retry-pushback-ms")),
        (Some(1), Some("250"))
    );
}

#[test]
fn messages_are_percent_encoded() {
    assert_eq!(percent_encode("a b%c\u{e9}\n~"), "a b%25c%C3%A9%0A~");
    let mut all = String::new();
    (0u8..128).for_each(|b| all.push(char::from(b)));
    assert!(percent_encode(&all)
        .bytes()
        .all(|b| (b' '..=b'~').contains(&b)));
}

#[test]
fn replay_judges_grpc_responses_by_their_grpc_status() {
    let grpc = Some(&b"application/grpc"[..]);
    // Status in the trailers: unknown length, so marked completed unstored.
    assert_eq!(replay_view(200, grpc, None, Some(12)), (200, None));
    // Trailers-only: judged by the code.
    assert_eq!(replay_view(200, grpc, Some(b"5"), Some(0)), (404, Some(0)));
    assert_eq!(replay_view(200, grpc, Some(b"13"), Some(0)), (500, Some(0)));
    assert_eq!(replay_view(200, grpc, Some(b"9"), Some(0)), (400, Some(0)));
    // The codes that invite a retry are judged 503: not stored by default.
    for code in [
        GrpcCode::Cancelled,
        GrpcCode::DeadlineExceeded,
        GrpcCode::Aborted,
        GrpcCode::ResourceExhausted,
        GrpcCode::Unavailable,
    ] {
        let value = code.value().to_string();
        let judged = replay_view(200, grpc, Some(value.as_bytes()), Some(0));
        assert_eq!(judged, (503, Some(0)), "{code}");
        assert!(!crate::replay::Replay::new().stores(judged.0), "{code}");
    }
    assert_eq!(replay_view(200, grpc, Some(b"99"), Some(0)), (500, Some(0)));
    // Not gRPC, or not a gRPC answer: as it is.
    assert_eq!(
        replay_view(200, Some(b"text/plain"), None, Some(3)),
        (200, Some(3))
    );
    assert_eq!(replay_view(502, grpc, None, Some(3)), (502, Some(3)));
    assert_eq!(replay_view(200, None, Some(b"0"), None), (200, None));
}

#[test]
fn grpc_timeout_bounds_a_grpc_callers_wait() {
    use crate::key::SimpleRequest;
    let req = |v: &str| SimpleRequest::new("POST", "/s/M").header("grpc-timeout", v);
    let t = |v: &str, wire| timeout(wire, &req(v));
    assert_eq!(t("3S", Wire::Grpc), Some(Duration::from_secs(3)));
    assert_eq!(t("250m", Wire::GrpcWeb), Some(Duration::from_millis(250)));
    assert_eq!(t("2H", Wire::Grpc), Some(Duration::from_secs(7200)));
    assert_eq!(t("1M", Wire::Grpc), Some(Duration::from_secs(60)));
    assert_eq!(t("7u", Wire::Grpc), Some(Duration::from_micros(7)));
    assert_eq!(t("9n", Wire::GrpcWebText), Some(Duration::from_nanos(9)));
    // Plain HTTP has no such deadline; malformed values are ignored.
    assert_eq!(t("3S", Wire::Http), None);
    for bad in ["", "S", "3", "3s", "123456789S", "-1S", "1.5S", "3 S"] {
        assert_eq!(t(bad, Wire::Grpc), None, "{bad:?}");
    }
    assert_eq!(
        timeout(Wire::Grpc, &SimpleRequest::new("POST", "/s/M")),
        None
    );
}

#[test]
fn a_grpc_wait_ends_a_tenth_before_the_callers_deadline_at_most_a_second() {
    let ms = Duration::from_millis;
    assert_eq!(answer_by(ms(3000)), ms(2700));
    assert_eq!(answer_by(ms(250)), ms(225));
    assert_eq!(answer_by(Duration::from_secs(60)), Duration::from_secs(59));
    assert_eq!(answer_by(Duration::ZERO), Duration::ZERO);
}
