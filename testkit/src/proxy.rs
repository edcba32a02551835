//! A TCP proxy in front of one master, switchable at run time between pass-through, added
//! latency (each direction), black-hole (accept, never answer) and reset (drop every
//! connection, refuse new ones); and a one-shot reset of the connection that carries the
//! next reply, after its request ran ([`FaultProxy::drop_next_reply`]). Bound to 127.0.0.1
//! on a free port; stops on drop.
//!
//! A black hole stalls the traffic instead of discarding it, as a network partition does to
//! a live TCP connection: nothing is lost, it arrives when the partition heals. (Discarding
//! bytes mid-stream is something TCP never does; it would desynchronize any pipelined
//! protocol, which is not the fault under test.)

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward everything at once.
    Pass,
    /// Forward everything after this delay, in each direction.
    Latency(Duration),
    /// Forward requests (client to server) after this delay, replies at once: a request
    /// that reaches the server late, and whose answer is back right after it ran.
    RequestLatency(Duration),
    /// Keep connections open but forward nothing either way until the fault changes.
    BlackHole,
    /// Drop every connection (RST) and every new one at once.
    Reset,
}

/// One proxy; see the module docs.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    fault: watch::Sender<Fault>,
    /// Armed by [`FaultProxy::drop_next_reply`]: the next reply is not forwarded, its
    /// connection is reset instead.
    drop_reply: Arc<AtomicBool>,
    accept: JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy to `upstream` on a free loopback port. Must run inside a runtime.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let (fault, watch) = watch::channel(Fault::Pass);
        let drop_reply = Arc::new(AtomicBool::new(false));
        let accept = tokio::spawn(accept_loop(listener, upstream, watch, drop_reply.clone()));
        Self {
            addr,
            fault,
            drop_reply,
            accept,
        }
    }

    /// Arms a one-shot fault: the next reply from upstream (on any connection) is not
    /// forwarded — that connection is reset (RST both ways) instead. The request it answers
    /// was forwarded and ran: the client sees a dropped connection after its command took
    /// effect. Other traffic passes as the current [`Fault`] says.
    pub fn drop_next_reply(&self) {
        self.drop_reply.store(true, Ordering::SeqCst);
    }

    /// Whether an armed [`FaultProxy::drop_next_reply`] has fired.
    pub fn reply_dropped(&self) -> bool {
        !self.drop_reply.load(Ordering::SeqCst)
    }

    /// Disarms a [`FaultProxy::drop_next_reply`] that has not fired; whether it was still
    /// armed (false: it fired, or none was armed).
    pub fn cancel_drop_reply(&self) -> bool {
        self.drop_reply.swap(false, Ordering::SeqCst)
    }

    /// Switches the proxy's behaviour; live connections follow at once.
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    /// The current behaviour.
    pub fn fault(&self) -> Fault {
        *self.fault.borrow()
    }

    /// `redis://127.0.0.1:PORT` of the proxy.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.set(Fault::Reset);
        self.accept.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    fault: watch::Receiver<Fault>,
    drop_reply: Arc<AtomicBool>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        if *fault.borrow() == Fault::Reset {
            reset(client);
            continue;
        }
        let fault = fault.clone();
        let drop_reply = drop_reply.clone();
        tokio::spawn(async move {
            let Ok(server) = TcpStream::connect(upstream).await else {
                reset(client);
                return;
            };
            for s in [&client, &server] {
                let _ = s.set_nodelay(true);
                // Every close is an RST, so a reset is abrupt on both sides.
                abortive_close(s);
            }
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            let mut up = tokio::spawn(pump(cr, sw, fault.clone(), None));
            // (`drop_reply` is given to the replies' pump only: it also tells the direction.)
            let mut down = tokio::spawn(pump(sr, cw, fault, Some(drop_reply)));
            // Either side ending ends both: the halves are dropped with their tasks.
            tokio::select! {
                _ = &mut up => {}
                _ = &mut down => {}
            }
            up.abort();
            down.abort();
        });
    }
}

/// Makes every close of `stream` an RST instead of a FIN. (A zero linger never blocks on
/// drop; only a positive one can, which is what the deprecation is about.)
#[allow(deprecated)]
fn abortive_close(stream: &TcpStream) {
    let _ = stream.set_linger(Some(Duration::ZERO));
}

/// Closes a connection with RST instead of FIN.
fn reset(stream: TcpStream) {
    abortive_close(&stream);
    drop(stream);
}

/// Copies `from` to `to` under the current fault, until either side closes or a reset. With
/// `drop_reply` armed, the next bytes read end the connection instead of being forwarded.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut fault: watch::Receiver<Fault>,
    drop_reply: Option<Arc<AtomicBool>>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let current = *fault.borrow_and_update();
        match current {
            Fault::Reset => return,
            Fault::BlackHole => {
                // Stall: read nothing, forward nothing, until the fault changes.
                if fault.changed().await.is_err() {
                    return;
                }
                continue;
            }
            Fault::Pass | Fault::Latency(_) | Fault::RequestLatency(_) => {}
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            changed = fault.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
        };
        if drop_reply
            .as_ref()
            .is_some_and(|armed| armed.swap(false, Ordering::SeqCst))
        {
            // Both halves are dropped with their tasks: an RST each way (linger 0).
            return;
        }
        let request = drop_reply.is_none();
        let delay = match *fault.borrow() {
            Fault::Latency(d) => Some(d),
            Fault::RequestLatency(d) if request => Some(d),
            _ => None,
        };
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
