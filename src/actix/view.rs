use std::any::Any;
use std::cell::{OnceCell, Ref};
use std::net::SocketAddr;

use actix_web::dev::{Extensions, ServiceRequest};
use actix_web::HttpMessage;

use crate::key::percent_decodes_to_utf8;
use crate::key::{ExtensionType, RequestView};

/// [`RequestView`] over an actix-web request (`http` 0.2 types).
///
/// No `Debug`, on purpose: the path, a header or a path parameter may carry the raw key.
pub(crate) struct ActixRequestView<'a> {
    req: &'a ServiceRequest,
    route: OnceCell<Option<String>>,
    /// Borrowed when an extractor first asks for an extension, for as long as the view lives
    /// (key extraction, before the request moves on).
    extensions: OnceCell<Ref<'a, Extensions>>,
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
