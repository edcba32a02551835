use std::cell::OnceCell;

use actix_web::dev::ServiceRequest;

use crate::http::RequestView;

/// [`RequestView`] over an actix-web request (`http` 0.2 types).
#[derive(Debug)]
pub struct ActixRequestView<'a> {
    req: &'a ServiceRequest,
    route: OnceCell<Option<String>>,
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
