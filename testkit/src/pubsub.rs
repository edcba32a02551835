//! A raw `SSUBSCRIBE` connection ([`Subscriber`]): what a waiter hears when a lock is deleted
//! (every delete of a lock publishes `released` on the sharded channel named as its key).
//! Raw RESP over TCP: redis-rs' async `PubSub` has no sharded subscribe.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A raw connection subscribed to sharded channels.
pub struct Subscriber {
    conn: TcpStream,
    seen: Vec<u8>,
}

impl Subscriber {
    /// Connects to `127.0.0.1:port` and subscribes to `channels` (bounded waits).
    pub async fn on(port: u16, channels: &[&str]) -> Self {
        let mut conn = TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        let mut cmd = format!("*{}\r\n$10\r\nSSUBSCRIBE\r\n", channels.len() + 1);
        for c in channels {
            cmd.push_str(&format!("${}\r\n{c}\r\n", c.len()));
        }
        conn.write_all(cmd.as_bytes()).await.expect("write");
        let mut sub = Self {
            conn,
            seen: Vec::new(),
        };
        for c in channels {
            sub.until(&format!("ssubscribe\r\n${}\r\n{c}\r\n", c.len()))
                .await;
        }
        sub
    }

    /// Reads until `text` has arrived (bounded), and forgets what came before it.
    pub async fn until(&mut self, text: &str) {
        let read = async {
            let mut buf = [0u8; 512];
            loop {
                if let Some(at) = find(&self.seen, text.as_bytes()) {
                    self.seen.drain(..at + text.len());
                    return;
                }
                let n = self.conn.read(&mut buf).await.expect("read");
                assert!(n > 0, "the subscriber's connection closed");
                self.seen.extend_from_slice(&buf[..n]);
            }
        };
        tokio::time::timeout(Duration::from_secs(5), read)
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no {text:?}; seen {:?}",
                    String::from_utf8_lossy(&self.seen)
                )
            });
    }

    /// The next message is a release of `key`.
    pub async fn released(&mut self, key: &str) {
        self.until("smessage\r\n").await;
        let head = format!("${}\r\n{key}\r\n$8\r\nreleased\r\n", key.len());
        // The message just begun must be `key`'s: nothing came between.
        let read = async {
            let mut buf = [0u8; 512];
            while self.seen.len() < head.len() {
                let n = self.conn.read(&mut buf).await.expect("read");
                self.seen.extend_from_slice(&buf[..n]);
            }
        };
        tokio::time::timeout(Duration::from_secs(5), read)
            .await
            .expect("the message");
        assert!(
            self.seen.starts_with(head.as_bytes()),
            "expected a release of {key}, got {:?}",
            String::from_utf8_lossy(&self.seen)
        );
        self.seen.drain(..head.len());
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
