//! HTTP/1.1 requests written by hand on a fresh connection, for what the HTTP client does not
//! send: a chunked request body whose chunks (and whether it ends) the test controls, or a
//! `Content-Length` whose body is never sent. The response is read by its framing
//! (`Content-Length` or chunked), never by waiting for the server to close.

use std::net::SocketAddr;

use bytes::{Buf, Bytes, BytesMut};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::http::{within, Reply};

/// `POST path` with `headers` and a chunked body of `chunks`, ended by the zero-size chunk
/// when `end` (otherwise the body stays open while the response is read).
pub async fn post_chunked(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    chunks: &[&[u8]],
    end: bool,
) -> Reply {
    let mut request = head(addr, path, headers, "transfer-encoding: chunked");
    for chunk in chunks.iter().filter(|c| !c.is_empty()) {
        request.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        request.extend_from_slice(chunk);
        request.extend_from_slice(b"\r\n");
    }
    if end {
        request.extend_from_slice(b"0\r\n\r\n");
    }
    exchange(addr, request).await
}

/// `POST path` with `headers` and `Content-Length: declared`, of which only `body` is sent
/// (all of it when `body.len() == declared`).
pub async fn post_declared(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    declared: usize,
    body: &[u8],
) -> Reply {
    let mut request = head(addr, path, headers, &format!("content-length: {declared}"));
    request.extend_from_slice(body);
    exchange(addr, request).await
}

fn head(addr: SocketAddr, path: &str, headers: &[(&str, &str)], framing: &str) -> Vec<u8> {
    let mut head = format!("POST {path} HTTP/1.1\r\nhost: {addr}\r\n{framing}\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    head.into_bytes()
}

/// Writes `request` on a new connection and reads one response.
async fn exchange(addr: SocketAddr, request: Vec<u8>) -> Reply {
    within(format!("a response to a raw request to {addr}"), async {
        let mut conn = TcpStream::connect(addr).await.expect("connect");
        conn.write_all(&request).await.expect("write the request");
        read_response(&mut conn).await
    })
    .await
}

async fn read_more(conn: &mut TcpStream, buf: &mut BytesMut) {
    let n = conn.read_buf(buf).await.expect("read the response");
    assert!(n > 0, "the connection closed in the middle of the response");
}

async fn read_response(conn: &mut TcpStream) -> Reply {
    let mut buf = BytesMut::new();
    let end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        read_more(conn, &mut buf).await;
    };
    let head = String::from_utf8(buf.split_to(end + 4).to_vec()).expect("an ASCII head");
    let mut lines = head.split("\r\n");
    let status_line = lines.next().expect("a status line");
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("a status line: {status_line:?}"));
    let mut headers = HeaderMap::new();
    for line in lines.filter(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':').expect("a header line");
        headers.append(
            HeaderName::from_bytes(name.trim().as_bytes()).expect("a header name"),
            HeaderValue::from_str(value.trim()).expect("a header value"),
        );
    }
    let body = if let Some(len) = headers.get("content-length") {
        let len: usize = len.to_str().unwrap().parse().expect("a Content-Length");
        while buf.len() < len {
            read_more(conn, &mut buf).await;
        }
        buf.split_to(len).freeze()
    } else if headers
        .get("transfer-encoding")
        .is_some_and(|te| te.as_bytes().eq_ignore_ascii_case(b"chunked"))
    {
        read_chunked(conn, &mut buf).await
    } else {
        assert!(
            status == 204 || status == 304,
            "a response of unknown length: {head}"
        );
        Bytes::new()
    };
    Reply {
        status,
        headers,
        body,
    }
}

async fn read_chunked(conn: &mut TcpStream, buf: &mut BytesMut) -> Bytes {
    let mut body = BytesMut::new();
    loop {
        let line_end = loop {
            if let Some(at) = buf.windows(2).position(|w| w == b"\r\n") {
                break at;
            }
            read_more(conn, buf).await;
        };
        let line = String::from_utf8(buf.split_to(line_end).to_vec()).expect("a chunk size");
        buf.advance(2);
        let size = usize::from_str_radix(line.split(';').next().unwrap().trim(), 16)
            .unwrap_or_else(|e| panic!("a chunk size {line:?}: {e}"));
        // The chunk, and the CRLF after it (after the last chunk: no trailers here).
        while buf.len() < size + 2 {
            read_more(conn, buf).await;
        }
        body.extend_from_slice(&buf.split_to(size));
        buf.advance(2);
        if size == 0 {
            return body.freeze();
        }
    }
}
