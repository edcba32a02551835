use std::any::Any;
use std::cell::{OnceCell, Ref};
use std::net::SocketAddr;

use actix_web::dev::{Extensions, ServiceRequest};
use actix_web::HttpMessage;

use crate::http::view::percent_decodes_to_utf8;
use crate::http::{ExtensionType, RequestView};

/// [`RequestView`] over an actix-web request (`http` 0.2 types).
///
/// Its `Debug` shows the method and the matched route pattern only: the path, a header or a
/// path parameter may carry the raw key.
pub(crate) struct ActixRequestView<'a> {
    req: &'a ServiceRequest,
    route: OnceCell<Option<String>>,
    /// Borrowed when an extractor first asks for an extension, for as long as the view lives
    /// (key extraction, before the request moves on).
    extensions: OnceCell<Ref<'a, Extensions>>,
}

impl std::fmt::Debug for ActixRequestView<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActixRequestView")
            .field("method", &self.method())
            .field("matched_route", &self.matched_route())
            .finish_non_exhaustive()
    }
}

impl<'a> ActixRequestView<'a> {
    /// A view of `req`.
    pub fn new(req: &'a ServiceRequest) -> Self {
        Self {
            req,
            route: OnceCell::new(),
            extensions: OnceCell::new(),
        }
    }
}

impl RequestView for ActixRequestView<'_> {
    fn method(&self) -> &str {
        self.req.method().as_str()
    }

    fn path(&self) -> &str {
        self.req.path()
    }

    fn matched_route(&self) -> Option<&str> {
        // Computed (and allocated) only when an extractor asks for it.
        self.route
            .get_or_init(|| self.req.match_pattern())
            .as_deref()
    }

    fn header(&self, name: &str) -> Option<&[u8]> {
        self.req.headers().get(name).map(|v| v.as_bytes())
    }

    fn header_count(&self, name: &str) -> usize {
        self.req.headers().get_all(name).count()
    }

    fn path_param(&self, name: &str) -> Option<&str> {
        let value = self.req.match_info().get(name)?;
        // A lossily decoded value is no value (as axum reports it): the extractor then sees
        // `path_params_malformed` and rejects the request as malformed.
        if value.contains('\u{FFFD}') && self.path_params_malformed() {
            return None;
        }
        Some(value)
    }

    fn path_params_malformed(&self) -> bool {
        // actix-web decodes parameters lossily: bytes that are not UTF-8 become U+FFFD, so
        // every undecodable parameter would share one key. A U+FFFD that the client really
        // sent is percent-encoded UTF-8, so the raw path decodes cleanly; a lossy one does not.
        self.req
            .match_info()
            .iter()
            .any(|(_, value)| value.contains('\u{FFFD}'))
            && !percent_decodes_to_utf8(self.req.uri().path())
    }

    fn query(&self) -> Option<&str> {
        self.req.uri().query()
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        self.req.peer_addr()
    }

    fn extension_of(&self, ty: &ExtensionType) -> Option<&dyn Any> {
        // Nothing borrows the extensions mutably while the middleware extracts the key.
        let extensions = self
            .extensions
            .get_or_init(|| HttpMessage::extensions(self.req));
        ty.in_actix(extensions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_raw_key() {
        let req = actix_web::test::TestRequest::post()
            .uri("/orders/zebra-42")
            .insert_header(("idempotency-key", "zebra-secret"))
            .to_srv_request();
        let view = ActixRequestView::new(&req);
        let shown = format!("{view:?} {view:#?}");
        assert!(shown.contains("POST"), "{shown}");
        assert!(!shown.contains("zebra"), "{shown}");
    }

    #[derive(Clone, Debug, PartialEq)]
    struct Principal(&'static str);

    #[test]
    fn sees_query_extensions_and_peer() {
        let req = actix_web::test::TestRequest::post()
            .uri("/orders/1?expand=all&x=1")
            .peer_addr("127.0.0.1:4242".parse().unwrap())
            .to_srv_request();
        req.extensions_mut().insert(Principal("acme"));
        let view = ActixRequestView::new(&req);
        assert_eq!(view.query(), Some("expand=all&x=1"));
        assert_eq!(view.peer_addr(), Some("127.0.0.1:4242".parse().unwrap()));
        let dyn_view: &dyn RequestView = &view;
        assert_eq!(dyn_view.extension::<Principal>(), Some(&Principal("acme")));
        assert_eq!(dyn_view.extension::<String>(), None);
        drop(view);
        // The view's borrow of the extensions ended with it.
        req.extensions_mut().insert(1_u8);
    }
}
