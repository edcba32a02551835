#![doc = include_str!("../../docs/tower.md")]

mod body;
#[cfg(feature = "axum")]
mod extract;
mod future;
mod glue;
pub(crate) mod layer;
mod request;
mod service;
mod view;

pub use self::body::{BodyError, LeaseBody};
pub use self::future::ResponseFuture;
pub use self::request::RequestBody;
pub use self::service::RedlockService;
pub(crate) use self::view::HttpRequestView;

#[cfg(test)]
mod assertions {
    use super::*;
    use crate::RedlockLayer;

    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}

    #[test]
    fn middleware_types_are_send_and_sync() {
        type Inner = tower::util::BoxCloneSyncService<
            http::Request<RequestBody<String>>,
            http::Response<String>,
            std::convert::Infallible,
        >;
        send_sync::<RedlockLayer>();
        send_sync::<RedlockService<Inner>>();
        send::<ResponseFuture<Inner, String>>();
        send::<LeaseBody<String>>();
    }
}
