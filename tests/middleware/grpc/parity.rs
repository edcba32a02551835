//! The tower/actix-web comparison: the same policies behind `RedlockLayer` and
//! `RedlockMiddleware`, the same gRPC requests, the same answers.

use std::convert::Infallible;

use tonic::codegen::http;
use tower_redlock::replay::Replay;
use tower_redlock::RedlockLayer;

use super::{policy_of, redis_key, support, PAY, REFUND};

/// The rejections of a gRPC request, as (status, header name, value) for the headers that
/// make a gRPC answer, and the body's length.
type Answer = (u16, Vec<(String, String)>, usize);

/// The gRPC answer's headers out of any header map.
fn grpc_headers<'a>(headers: impl Iterator<Item = (&'a str, &'a [u8])>) -> Vec<(String, String)> {
    const NAMES: [&str; 5] = [
        "content-type",
        "grpc-status",
        "grpc-message",
        "retry-after",
        "grpc-retry-pushback-ms",
    ];
    let mut out: Vec<_> = headers
        .filter(|(n, _)| NAMES.contains(n))
        .map(|(n, v)| (n.to_owned(), String::from_utf8_lossy(v).into_owned()))
        .collect();
    out.sort();
    out
}

/// A request of the tower/actix-web comparison.
struct Ask {
    /// `PAY` (no replay) or `REFUND` (replay, body limit [`BODY_LIMIT`]).
    path: &'static str,
    content_type: &'static str,
    key: Option<String>,
    /// Sent with its `content-length`.
    body: &'static [u8],
}

/// The request body limit of the replay policy in the comparison.
const BODY_LIMIT: usize = 16;

/// The same rejections from `RedlockLayer` and from `RedlockMiddleware`: a gRPC request over
/// HTTP/1.1 to actix-web gets the gRPC answer tower gives, header for header, without and
/// with replay, for gRPC and gRPC-Web.
#[actix_web::test]
async fn grpc_answers_are_the_same_on_tower_and_actix() {
    use actix_web::{test, web, App, HttpResponse};
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use support::{apps::client_of, Masters};
    use tonic::codegen::Body as _;
    use tower::{Layer, ServiceExt};
    use tower_redlock::RedlockMiddleware;

    let m = Masters::start(3);
    let redlock = client_of(&m).await;
    let plain = policy_of(&redlock).build().unwrap();
    let replay = policy_of(&redlock)
        .replay(Replay::new().body_limit(BODY_LIMIT))
        .build()
        .unwrap();
    let actix = test::init_service(
        App::new()
            .service(
                web::resource(PAY).route(
                    web::post()
                        .to(HttpResponse::Ok)
                        .wrap(RedlockMiddleware::new(plain.clone())),
                ),
            )
            .service(
                web::resource(REFUND).route(
                    web::post()
                        .to(HttpResponse::Ok)
                        .wrap(RedlockMiddleware::new(replay.clone())),
                ),
            ),
    )
    .await;
    let inner = tower::service_fn(|_req: http::Request<_>| async {
        Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::new())))
    });
    let tower_plain = RedlockLayer::new(plain).layer(inner);
    let tower_replay = RedlockLayer::new(replay).layer(inner);

    let actix_answer = |ask: &Ask| {
        let mut req = test::TestRequest::post()
            .uri(ask.path)
            .insert_header(("content-type", ask.content_type))
            .set_payload(ask.body);
        if let Some(key) = &ask.key {
            req = req.insert_header(("idempotency-key", key.as_str()));
        }
        let req = req.to_request();
        async {
            let res = test::call_service(&actix, req).await;
            let status = res.status().as_u16();
            let headers = grpc_headers(
                res.headers()
                    .iter()
                    .map(|(n, v)| (n.as_str(), v.as_bytes())),
            );
            let body = test::read_body(res).await;
            (status, headers, body.len())
        }
    };
    let ask_both = |ask: Ask| {
        let (tower_plain, tower_replay) = (tower_plain.clone(), tower_replay.clone());
        let actix_answer = &actix_answer;
        async move {
            let from_actix: Answer = actix_answer(&ask).await;

            let mut req = http::Request::post(ask.path)
                .header("content-type", ask.content_type)
                .header("content-length", ask.body.len());
            if let Some(key) = &ask.key {
                req = req.header("idempotency-key", key.as_str());
            }
            let req = req.body(Full::new(Bytes::from_static(ask.body))).unwrap();
            let tower = if ask.path == PAY {
                tower_plain
            } else {
                tower_replay
            };
            let res = tower.oneshot(req).await.unwrap();
            let status = res.status().as_u16();
            let headers = grpc_headers(
                res.headers()
                    .iter()
                    .map(|(n, v)| (n.as_str(), v.as_bytes())),
            );
            // Trailers-only: the stream ends with the HEADERS frame.
            assert!(
                status != 200 || res.body().is_end_stream(),
                "a trailers-only answer with a body to poll"
            );
            let body = res.into_body().collect().await.unwrap().to_bytes();
            let from_tower: Answer = (status, headers, body.len());
            assert_eq!(from_actix, from_tower, "actix-web and tower differ");
            from_tower
        }
    };
    let grpc = |path, key: Option<&str>, body| Ask {
        path,
        content_type: "application/grpc",
        key: key.map(str::to_owned),
        body,
    };
    // (content-type, grpc-status, retry-after, grpc-retry-pushback-ms) of a trailers-only
    // answer.
    let code = |answer: &Answer| {
        let find = |name: &str| {
            answer
                .1
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(answer.0, 200, "{answer:?}");
        assert_eq!(answer.2, 0, "a body: {answer:?}");
        (
            find("content-type").expect("content-type"),
            find("grpc-status").expect("grpc-status"),
            find("retry-after"),
            find("grpc-retry-pushback-ms"),
        )
    };
    let grpc_code = |answer: &Answer| {
        let (content_type, status, retry, pushback) = code(answer);
        assert_eq!(content_type, "application/grpc", "{answer:?}");
        (status, retry, pushback)
    };

    assert_eq!(
        grpc_code(&ask_both(grpc(PAY, None, b"")).await),
        ("3".into(), None, None)
    );
    let long = "z".repeat(256);
    assert_eq!(
        grpc_code(&ask_both(grpc(PAY, Some(&long), b"")).await),
        ("3".into(), None, None)
    );
    // gRPC-Web: the answer has the request's gRPC-Web type, without its codec.
    for (sent, answered) in [
        ("application/grpc-web+proto", "application/grpc-web"),
        ("application/grpc-web-text", "application/grpc-web-text"),
    ] {
        let ask = Ask {
            content_type: sent,
            ..grpc(PAY, None, b"")
        };
        assert_eq!(
            code(&ask_both(ask).await),
            (answered.into(), "3".into(), None, None)
        );
    }

    // Replay: a body whose content-length is over the limit is RESOURCE_EXHAUSTED.
    let large = &[7u8; BODY_LIMIT + 1];
    let answer = ask_both(grpc(REFUND, Some("order-grpc-large"), large)).await;
    assert_eq!(grpc_code(&answer), ("8".into(), None, None));
    // A key reused with another payload is FAILED_PRECONDITION (stored by either framework:
    // the record is the same).
    const REUSED: &str = "order-grpc-reused";
    let first = actix_answer(&grpc(REFUND, Some(REUSED), b"amount=1")).await;
    assert_eq!(first.0, 200, "{first:?}");
    let answer = ask_both(grpc(REFUND, Some(REUSED), b"amount=2")).await;
    assert_eq!(grpc_code(&answer), ("9".into(), None, None));

    // Held by a holder without an expiry (a foreign plain SET): the hint is 1 s, on both.
    const KEY: &str = "order-grpc-actix";
    for master in m.iter() {
        assert!(master.set_nx(&redis_key(PAY, KEY), "foreign", None).await);
    }
    let held = ask_both(grpc(PAY, Some(KEY), b"")).await;
    assert_eq!(
        grpc_code(&held),
        ("10".into(), Some("1".into()), Some("1000".into()))
    );
    m[1].stop();
    m[2].stop();
    let down = ask_both(grpc(PAY, Some("order-grpc-down"), b"")).await;
    assert_eq!(
        grpc_code(&down),
        ("14".into(), Some("1".into()), Some("1000".into()))
    );
}
