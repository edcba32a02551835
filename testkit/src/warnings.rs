//! The warnings the crate logs (and its debug lines), captured for a test: a subscriber for
//! the test's thread only (a `#[tokio::test]` runtime is single-threaded: the client's spawned
//! tasks log there too), so tests running in parallel do not hear each other.

use std::io::Write;
use std::sync::{Arc, Mutex};

use tracing::subscriber::DefaultGuard;

/// The warnings logged on this thread while it lives, and this crate's debug lines.
pub struct Warnings {
    text: Arc<Mutex<Vec<u8>>>,
    _guard: DefaultGuard,
}

impl Warnings {
    pub fn capture() -> Self {
        let text = Arc::new(Mutex::new(Vec::new()));
        let sink = Sink(text.clone());
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                "warn,tower_redlock=debug",
            ))
            .with_ansi(false)
            .with_writer(move || sink.clone())
            .finish();
        Self {
            text,
            _guard: tracing::subscriber::set_default(subscriber),
        }
    }

    /// How many lines so far, of any level, contain `text`.
    pub fn mentions(&self, text: &str) -> usize {
        let all = self.text.lock().unwrap();
        String::from_utf8_lossy(&all)
            .lines()
            .filter(|l| l.contains(text))
            .count()
    }

    /// How many warnings so far contain `text`.
    pub fn count(&self, text: &str) -> usize {
        let all = self.text.lock().unwrap();
        String::from_utf8_lossy(&all)
            .lines()
            .filter(|l| l.contains(" WARN ") && l.contains(text))
            .count()
    }
}

#[derive(Clone)]
struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
