use std::cell::OnceCell;

use actix_web::dev::ServiceRequest;

use crate::http::RequestView;

/// [`RequestView`] over an actix-web request (`http` 0.2 types).
///
/// Its `Debug` shows the method and the matched route pattern only: the path, a header or a
/// path parameter may carry the raw key.
pub struct ActixRequestView<'a> {
    req: &'a ServiceRequest,
    route: OnceCell<Option<String>>,
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
        self.req.match_info().get(name)
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
}
