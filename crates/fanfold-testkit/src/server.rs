//! An axum app on 127.0.0.1, served from a runtime of its own in a
//! background thread: the engine and the backends are synchronous and are
//! called from the test's thread, outside any runtime.

use std::net::SocketAddr;
use std::thread::JoinHandle;

use axum::Router;
use axum::serve::ListenerExt;

/// The name of the server's runtime threads, as `/proc/self/task/*/comm`
/// shows it (at most 15 bytes), so a bench can tell its CPU time apart.
pub const THREAD_NAME: &str = "fanfold-mock";

/// A running server; dropping it stops the server and joins its thread.
pub struct Server {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Serves `app` on a free loopback port with two worker threads.
    pub fn start(app: Router) -> std::io::Result<Server> {
        Server::start_with(app, 2)
    }

    /// Serves `app` with `workers` runtime threads. Sockets are set
    /// `TCP_NODELAY`, so a small answer never waits on Nagle's algorithm.
    pub fn start_with(app: Router, workers: usize) -> std::io::Result<Server> {
        Server::start_at(app, SocketAddr::from(([127, 0, 0, 1], 0)), workers)
    }

    /// Serves `app` at `addr` (port 0 picks a free one).
    pub fn start_at(app: Router, addr: SocketAddr, workers: usize) -> std::io::Result<Server> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers.max(1))
            .thread_name(THREAD_NAME)
            .enable_all()
            .build()?;
        let listener = runtime.block_on(tokio::net::TcpListener::bind(addr))?;
        let addr = listener.local_addr()?;
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            runtime.block_on(async move {
                let _ = axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await;
            });
        });
        Ok(Server {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Blocks until the server stops (it never does on its own): for a
    /// command that serves until it is interrupted.
    pub fn wait(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// The OpenAI-style base URL, with `/v1`.
    pub fn openai_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The Anthropic-style base URL.
    pub fn anthropic_url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
