//! `redlock key`: the Redis key the middleware locks for a request, computed by a real
//! [`LockPolicy`] over an in-memory client ([`LockPolicy::redis_key`]): the middleware's own
//! code path, no Redis needed.

use serde::Serialize;
use tower_redlock::key::{
    GrpcMethodKey, HeaderKey, IdempotencyKey, KeyExtractor, KeyExtractorExt, MethodPathKey,
    PathKey, RouteParamKey, SimpleRequest,
};
use tower_redlock::node::MemoryNode;
use tower_redlock::policy::LockPolicy;
use tower_redlock::Redlock;

use crate::args::{Global, KeyArgs, Scope, Source};
use crate::exit::{self, Failure, Outcome};
use crate::output::json_line;

/// The `--help` of `redlock key`: what it reproduces, and what needs the library.
pub const LONG_ABOUT: &str = "\
The Redis key the middleware locks for a request, computed by the library's own
LockPolicy::redis_key over a policy built from these flags (no Redis needed).

Give the request's parts (--method, --path, --route, --header, --param) and the
application's extractor: its source (--source), its scopings in the order the
application applies them (--scope, repeatable), its prefix (--prefix), and the
policy's hmac_key (--hmac-key-env) and locked methods (--methods). The global
--key-prefix is the Redlock client's key prefix.

It reproduces: the built-in sources (IdempotencyKey, HeaderKey, PathKey,
MethodPathKey, RouteParamKey, GrpcMethodKey, required or --optional), the scopings
scoped_by_route, scoped_by_method, scoped_by_header, scoped_by_grpc_method,
scoped_by_extension given the value its closure returns for the request
(extension:VALUE, e.g. the tenant id), the extractor's prefix, the policy's
hmac_key and methods, and the client's key prefix.

It cannot reproduce code: a custom key_fn or KeyExtractor, scoped_by closures, or
only_grpc_service. For those, call LockPolicy::redis_key (or LockPolicy::inspect)
on the application's own policy with a SimpleRequest.

Prints the key (exit 0); a request the policy lets through unlocked prints why
(exit 3); a key the middleware would reject prints the 400's reason (exit 2).";

/// The value an application's `scoped_by_extension` closure returns for the request, one per
/// `--scope extension:VALUE` in order (the key material is the value, whatever the type).
#[derive(Debug, Clone)]
struct ScopeValues(Vec<String>);

/// The JSON of `redlock key`: the key, or why there is none.
#[derive(Debug, Serialize)]
struct Report {
    key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

/// Computes the key; exit 0 with a key, 3 when the request passes unlocked, 2 for a key the
/// middleware rejects or a policy that does not build.
pub fn run(global: &Global, args: &KeyArgs) -> Outcome {
    let policy = policy(global, args)?;
    let request = request(args);
    let (report, code) = match policy.redis_key(&request) {
        Ok(Some(key)) => (
            Report {
                key: Some(key),
                reason: None,
            },
            exit::OK,
        ),
        Ok(None) => {
            let reason = if policy.locks_method(&args.method.to_ascii_uppercase()) {
                "no key in this request: it passes through unlocked".to_owned()
            } else {
                format!(
                    "the policy does not lock {} requests: it passes through unlocked",
                    args.method
                )
            };
            (
                Report {
                    key: None,
                    reason: Some(reason),
                },
                exit::UNLOCKED,
            )
        }
        Err(rejection) => (
            Report {
                key: None,
                reason: Some(format!(
                    "{} {}: {}",
                    rejection.status(),
                    rejection.title(),
                    rejection.detail()
                )),
            },
            exit::USAGE,
        ),
    };
    match (global.json, &report.key) {
        (true, _) => json_line(&report),
        (false, Some(key)) => println!("{key}"),
        (false, None) => eprintln!("redlock: {}", report.reason.unwrap_or_default()),
    }
    Ok(code)
}

/// The policy the flags describe, over an in-memory client with the client's key prefix.
fn policy(global: &Global, args: &KeyArgs) -> Result<LockPolicy, Failure> {
    let mut redlock = Redlock::builder().node(MemoryNode::new());
    if let Some(prefix) = &global.key_prefix {
        redlock = redlock.key_prefix(prefix.as_str());
    }
    let redlock = redlock.build().map_err(Failure::usage)?;
    let mut builder = LockPolicy::builder(redlock, extractor(args));
    match args.methods.as_slice() {
        [] => {}
        [any] if any.eq_ignore_ascii_case("any") => builder = builder.any_method(),
        methods => builder = builder.methods(methods.iter().map(|m| m.trim())),
    }
    if let Some(var) = &args.hmac_key_env {
        let secret = std::env::var(var).map_err(|_| {
            Failure::usage(format!(
                "--hmac-key-env {var}: the environment variable is not set (or not UTF-8)"
            ))
        })?;
        builder = builder.hmac_key(secret.as_bytes());
    }
    builder.build().map_err(Failure::usage)
}

/// The extractor: the source, each scoping in order, then the prefix.
fn extractor(args: &KeyArgs) -> Box<dyn KeyExtractor> {
    let mut extractor: Box<dyn KeyExtractor> = match &args.source {
        Source::IdempotencyKey if args.optional => Box::new(IdempotencyKey::optional()),
        Source::IdempotencyKey => Box::new(IdempotencyKey::required()),
        Source::Header(name) if args.optional => Box::new(HeaderKey::new(name.clone()).optional()),
        Source::Header(name) => Box::new(HeaderKey::new(name.clone())),
        Source::Path => Box::new(PathKey),
        Source::MethodPath => Box::new(MethodPathKey),
        Source::RouteParam(name) => Box::new(RouteParamKey::new(name.clone())),
        Source::GrpcMethod => Box::new(GrpcMethodKey::new()),
    };
    let mut extensions = 0;
    for scope in &args.scopes {
        extractor = match scope {
            Scope::Route => Box::new(extractor.scoped_by_route()),
            Scope::Method => Box::new(extractor.scoped_by_method()),
            Scope::Header(name) => Box::new(extractor.scoped_by_header(name.clone())),
            Scope::GrpcMethod => Box::new(extractor.scoped_by_grpc_method()),
            Scope::Extension(_) => {
                let i = extensions;
                extensions += 1;
                Box::new(extractor.scoped_by_extension(move |v: &ScopeValues| v.0[i].clone()))
            }
        };
    }
    match &args.prefix {
        Some(prefix) => Box::new(extractor.prefix(prefix.as_str())),
        None => extractor,
    }
}

/// The request the flags describe.
fn request(args: &KeyArgs) -> SimpleRequest {
    let mut req = SimpleRequest::new(args.method.to_ascii_uppercase(), args.path.clone());
    if let Some(route) = &args.route {
        req = req.route(route.clone());
    }
    for (name, value) in &args.headers {
        req = req.header(name, value);
    }
    for (name, value) in &args.params {
        req = req.param(name.clone(), value.clone());
    }
    let values: Vec<String> = args
        .scopes
        .iter()
        .filter_map(|s| match s {
            Scope::Extension(v) => Some(v.clone()),
            _ => None,
        })
        .collect();
    if values.is_empty() {
        req
    } else {
        req.extension(ScopeValues(values))
    }
}
