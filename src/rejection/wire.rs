//! How the client of a request expects the middleware's own answers: plain HTTP or one of
//! gRPC's wires, from the request's `content-type`. Its own module, beside both the gRPC
//! answers (`grpc`) and the rejection that carries it (`rejection`), so that neither imports
//! the other for it.

use crate::key::RequestView;

/// How the client of a request expects the middleware's own answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Wire {
    /// Plain HTTP: problem+json.
    #[default]
    Http,
    /// gRPC over HTTP/2 (`application/grpc[+codec]`).
    Grpc,
    /// gRPC-Web, binary (`application/grpc-web[+codec]`).
    GrpcWeb,
    /// gRPC-Web, base64 (`application/grpc-web-text[+codec]`).
    GrpcWebText,
}

impl Wire {
    /// The wire of `req`, from its `content-type`.
    pub(crate) fn of(req: &dyn RequestView) -> Self {
        req.header("content-type")
            .map_or(Self::Http, Self::of_content_type)
    }

    pub(crate) fn of_content_type(content_type: &[u8]) -> Self {
        // `rest` continues a media type when it ends it or starts a suffix or parameters.
        let ends = |rest: &[u8]| matches!(rest.first(), None | Some(b'+' | b';' | b' ' | b'\t'));
        let Some(rest) =
            strip_prefix_ignore_case(content_type.trim_ascii_start(), b"application/grpc")
        else {
            return Self::Http;
        };
        if ends(rest) {
            return Self::Grpc;
        }
        let Some(rest) = strip_prefix_ignore_case(rest, b"-web") else {
            return Self::Http;
        };
        if ends(rest) {
            return Self::GrpcWeb;
        }
        match strip_prefix_ignore_case(rest, b"-text") {
            Some(rest) if ends(rest) => Self::GrpcWebText,
            _ => Self::Http,
        }
    }

    /// The `content-type` of a trailers-only answer on this wire.
    pub(crate) fn content_type(self) -> &'static str {
        match self {
            // A trailers-only gRPC answer's media type.
            Self::Http | Self::Grpc => "application/grpc",
            Self::GrpcWeb => "application/grpc-web",
            Self::GrpcWebText => "application/grpc-web-text",
        }
    }
}

fn strip_prefix_ignore_case<'a>(s: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    (s.len() >= prefix.len() && s[..prefix.len()].eq_ignore_ascii_case(prefix))
        .then(|| &s[prefix.len()..])
}
