#![doc = include_str!("../../docs/actix.md")]

mod body;
mod extract;
mod glue;
pub(crate) mod middleware;
mod view;

pub use self::body::LeaseBody;
pub use self::middleware::RedlockMiddlewareService;
pub(crate) use self::view::ActixRequestView;
