use http::request::Parts;

use crate::http::RequestView;

/// [`RequestView`] over an `http` 1.x request (axum, hyper, tonic).
///
/// With the `axum` feature it also sees axum's matched route (`MatchedPath`) and path
/// parameters, when the layer runs after routing (`Router::layer` / `route_layer`).
#[derive(Debug)]
pub struct HttpRequestView<'a> {
    parts: &'a Parts,
    #[cfg(feature = "axum")]
    params: Option<axum::extract::RawPathParams>,
}

impl<'a> HttpRequestView<'a> {
    /// A view of `parts`. Takes `&mut` only to read axum's path parameters.
    pub fn new(parts: &'a mut Parts) -> Self {
        #[cfg(feature = "axum")]
        let params = {
            use axum::extract::FromRequestParts;
            use futures_util::FutureExt;
            // The extractor is synchronous: it only reads an extension.
            axum::extract::RawPathParams::from_request_parts(parts, &())
                .now_or_never()
                .and_then(Result::ok)
        };
        Self {
            parts,
            #[cfg(feature = "axum")]
            params,
        }
    }
}

impl RequestView for HttpRequestView<'_> {
    fn method(&self) -> &str {
        self.parts.method.as_str()
    }

    fn path(&self) -> &str {
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
