//! The request flow that the tower/axum and actix-web glue share: take the key's lock, run
//! the handler (or replay, or reject), watch the lease while the response streams, release.
//!
//! Nothing here depends on an HTTP framework or on either major version of the `http` crate:
//! axum 0.8 speaks `http` 1.x while actix-web 4 speaks `http` 0.2. Each framework's glue
//! adapts its request to [`RequestView`](crate::key::RequestView) and its response to
//! [`flow::Glue`]; everything else is here.

mod answer;
mod durable;
pub(crate) mod flow;
mod keep_alive;
mod release;
pub(crate) mod watch;

pub(crate) use keep_alive::KeptAlive;
pub(crate) use release::{release, AfterResponse, BodyTail, Next};
