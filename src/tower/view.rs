use std::any::Any;
use std::net::SocketAddr;

use http::request::Parts;

use crate::key::{ExtensionType, RequestView};

/// [`RequestView`] over an `http` 1.x request (axum, hyper, tonic).
///
/// With the `axum` feature it also sees axum's matched route (`MatchedPath`) and path
/// parameters, when the layer runs after routing (`Router::layer` / `route_layer`), and the
/// peer address when the app is served with
/// `into_make_service_with_connect_info::<SocketAddr>()`.
///
/// No `Debug`, on purpose: the path, a header or a path parameter may carry the raw key.
pub(crate) struct HttpRequestView<'a> {
    parts: &'a Parts,
    #[cfg(feature = "axum")]
    params: Option<axum::extract::RawPathParams>,
    /// axum matched parameters that are not UTF-8 once percent-decoded.
    #[cfg(feature = "axum")]
    params_malformed: bool,
}

impl<'a> HttpRequestView<'a> {
    /// A view of `parts`. Takes `&mut` only to read axum's path parameters.
    pub fn new(parts: &'a mut Parts) -> Self {
        #[cfg(feature = "axum")]
        let (params, params_malformed) = {
            use axum::extract::rejection::RawPathParamsRejection;
            use axum::extract::FromRequestParts;
            use futures_util::FutureExt;
            // Only routes with parameters have any: reading them copies them, and most
            // requests do not need to pay for that.
            let has_params = parts
                .extensions
                .get::<axum::extract::MatchedPath>()
                .is_some_and(|m| m.as_str().contains('{'));
            // The extractor is synchronous: it only reads an extension.
            let read = has_params.then(|| {
                axum::extract::RawPathParams::from_request_parts(parts, &()).now_or_never()
            });
            match read.flatten() {
                Some(Ok(params)) => (Some(params), false),
                Some(Err(RawPathParamsRejection::InvalidUtf8InPathParam(_))) => (None, true),
                _ => (None, false),
            }
        };
        Self {
            parts,
            #[cfg(feature = "axum")]
            params,
            #[cfg(feature = "axum")]
            params_malformed,
        }
    }
}

impl RequestView for HttpRequestView<'_> {
    fn method(&self) -> &str {
        self.parts.method.as_str()
    }

    fn path(&self) -> &str {
        // Inside a nested router axum strips the prefix from the URI; the full path is the
        // one actix-web reports, and the one the client sent.
        #[cfg(feature = "axum")]
        if let Some(original) = self.parts.extensions.get::<axum::extract::OriginalUri>() {
            return original.0.path();
        }
        self.parts.uri.path()
    }

    fn matched_route(&self) -> Option<&str> {
        #[cfg(feature = "axum")]
        {
            self.parts
                .extensions
                .get::<axum::extract::MatchedPath>()
                .map(|m| m.as_str())
        }
        #[cfg(not(feature = "axum"))]
        {
            None
        }
    }

    fn header(&self, name: &str) -> Option<&[u8]> {
        self.parts.headers.get(name).map(|v| v.as_bytes())
    }

    fn header_count(&self, name: &str) -> usize {
        self.parts.headers.get_all(name).iter().count()
    }

    fn path_params_malformed(&self) -> bool {
        #[cfg(feature = "axum")]
        {
            self.params_malformed
        }
        #[cfg(not(feature = "axum"))]
        {
            false
        }
    }

    fn query(&self) -> Option<&str> {
        self.parts.uri.query()
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        #[cfg(feature = "axum")]
        {
            self.parts
                .extensions
                .get::<axum::extract::ConnectInfo<SocketAddr>>()
                .map(|c| c.0)
        }
        #[cfg(not(feature = "axum"))]
        {
            None
        }
    }

    fn extension_of(&self, ty: &ExtensionType) -> Option<&dyn Any> {
        ty.in_http(&self.parts.extensions)
    }

    fn path_param(&self, name: &str) -> Option<&str> {
        #[cfg(feature = "axum")]
        {
            self.params
                .as_ref()
                .and_then(|p| p.iter().find(|(k, _)| *k == name).map(|(_, v)| v))
        }
        #[cfg(not(feature = "axum"))]
        {
            let _ = name;
            None
        }
    }
}
