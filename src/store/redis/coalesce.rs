//! Writes held back until the runtime has nothing else to run, so that the commands of many
//! concurrent decisions leave in one write (feature `tls`).
//!
//! redis-rs's multiplexed connection writes what it has whenever no other command is waiting
//! in its channel. On a tokio worker, a decision that sends its command wakes the connection's
//! task to run next on that worker (tokio's LIFO optimisation), right after that one decision:
//! every command leaves alone, in a write of its own. Over plain TCP the kernel joins them and
//! Redis reads many at once. Over TLS each write is a record of its own, and Redis reads,
//! decrypts, answers and encrypts one record per turn of its event loop: with 50 decisions in
//! flight it spends its time on records rather than on commands (3.4x fewer decisions a
//! second than over TCP, measured by `scripts/tls_bench.sh`).
//!
//! [`Coalesce`] sits between the connection and the TLS stream. The first write of a batch is
//! held: the connection's task is woken again once the worker has run everything that was
//! ready (tokio's deferred wake, the one [`tokio::task::yield_now`] uses), and meanwhile every
//! decision that sends wakes it as before, adding its command. So the commands of every
//! decision ready at the same time leave in one record, and a lone decision waits only for its
//! task to be polled once more. A batch of at least [`RECORD`] bytes leaves at once.
//!
//! The change belongs in redis-rs (the same hold in its pipeline's flush, for every
//! transport); until it is there, the store makes its own TLS connections to put it in.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The plaintext of one full TLS record: a batch this large is not held.
pub(super) const RECORD: usize = 16 * 1024;

/// A stream whose writes are held until the runtime is idle, or the batch fills a record.
#[derive(Debug)]
pub(super) struct Coalesce<S> {
    inner: S,
    idle: Arc<Idle>,
    /// A batch is held, and the runtime was asked to wake the task when idle.
    holding: bool,
    /// A batch is being written (until the flush that ends it): the rest of a partial write
    /// is not held again.
    writing: bool,
}

/// The deferred wake: it marks the batch free to leave, then wakes the connection's task.
#[derive(Debug, Default)]
struct Idle {
    free: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Idle {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.free.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl<S> Coalesce<S> {
    pub(super) fn new(inner: S) -> Self {
        Coalesce {
            inner,
            idle: Arc::default(),
            holding: false,
            writing: false,
        }
    }

    /// Whether a write of `len` bytes is held back now (the task is woken when it may go).
    fn hold(&mut self, cx: &mut Context<'_>, len: usize) -> bool {
        if self.writing || len >= RECORD || self.idle.free.swap(false, Ordering::AcqRel) {
            self.holding = false;
            self.writing = true;
            return false;
        }
        self.idle.task.register(cx.waker());
        if !self.holding {
            self.holding = true;
            // `yield_now` defers the waker it is polled with until the worker has run what
            // is ready (outside a runtime, it wakes at once: the batch then leaves at once).
            let waker = Waker::from(self.idle.clone());
            let deferred = std::pin::pin!(tokio::task::yield_now());
            let _pending = std::future::Future::poll(deferred, &mut Context::from_waker(&waker));
        }
        true
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Coalesce<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Coalesce<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.hold(cx, buf.len()) {
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.hold(cx, bufs.iter().map(|b| b.len()).sum()) {
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let flushed = Pin::new(&mut self.inner).poll_flush(cx);
        if flushed.is_ready() {
            // The batch is out: the next one is held.
            self.writing = false;
        }
        flushed
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use tokio::io::AsyncWriteExt;

    /// A sink that records each write it is given.
    #[derive(Clone, Default)]
    struct Writes(Arc<Mutex<Vec<usize>>>);

    impl AsyncWrite for Writes {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.0.lock().unwrap().push(buf.len());
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// As a multiplexed connection is used: `senders` tasks each send a command `rounds`
    /// times, awaiting its answer; the connection's task takes every command waiting in its
    /// channel, writes them together (through [`Coalesce`] when `coalesce`), then answers
    /// them. Returns the writes.
    fn decisions(senders: usize, rounds: usize, coalesce: bool) -> Vec<usize> {
        type Command = (Vec<u8>, tokio::sync::oneshot::Sender<()>);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .expect("a runtime");
        let writes = Writes::default();
        let seen = writes.clone();
        runtime.block_on(async move {
            let (tx, mut rx) = tokio::sync::mpsc::channel::<Command>(senders);
            let connection = tokio::spawn(async move {
                let mut plain = writes.clone();
                let mut held = Coalesce::new(writes);
                let mut batch = Vec::new();
                while rx.recv_many(&mut batch, senders).await > 0 {
                    let bytes: Vec<u8> = batch.iter().flat_map(|(b, _)| b.clone()).collect();
                    // Written and flushed, as redis-rs's codec does.
                    match coalesce {
                        true => {
                            held.write_all(&bytes).await.expect("written");
                            held.flush().await.expect("flushed");
                        }
                        false => plain.write_all(&bytes).await.expect("written"),
                    }
                    for (_, answer) in batch.drain(..) {
                        let _ = answer.send(());
                    }
                }
            });
            let tasks: Vec<_> = (0..senders)
                .map(|_| {
                    let tx = tx.clone();
                    tokio::spawn(async move {
                        for _ in 0..rounds {
                            let (answer, answered) = tokio::sync::oneshot::channel();
                            tx.send((vec![0; 100], answer)).await.expect("sent");
                            answered.await.expect("answered");
                        }
                    })
                })
                .collect();
            drop(tx);
            for task in tasks {
                task.await.expect("a sender");
            }
            connection.await.expect("the connection");
        });
        let writes = seen.0.lock().unwrap().clone();
        assert_eq!(writes.iter().sum::<usize>(), senders * rounds * 100);
        writes
    }

    #[test]
    fn commands_ready_together_leave_in_one_write() {
        // 50 decisions at a time, 20 each: 1,000 commands.
        let plain = decisions(50, 20, false);
        let held = decisions(50, 20, true);
        assert!(
            plain.len() >= 500,
            "without it, about a write each: {}",
            plain.len()
        );
        // About 40 on an idle machine; a loaded one (tests in parallel on two cores) splits a
        // few batches more (110 seen): still a fraction of the writes without it.
        assert!(held.len() <= 250, "{} writes: {held:?}", held.len());
    }

    #[test]
    fn a_lone_command_leaves_at_once() {
        assert_eq!(decisions(1, 3, true), [100, 100, 100]);
    }

    #[test]
    fn a_full_record_and_the_rest_of_a_batch_are_not_held() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        let writes = Writes::default();
        let mut held = Coalesce::new(writes.clone());
        runtime.block_on(async {
            let waker = Waker::noop();
            let mut cx = Context::from_waker(waker);
            let full = vec![0; RECORD];
            let poll = Pin::new(&mut held).poll_write(&mut cx, &full);
            assert!(matches!(poll, Poll::Ready(Ok(n)) if n == RECORD));
            let poll = Pin::new(&mut held).poll_write(&mut cx, &full[..10]);
            assert!(poll.is_ready(), "the rest of a batch is not held");
            let poll = Pin::new(&mut held).poll_flush(&mut cx);
            assert!(poll.is_ready());
            let poll = Pin::new(&mut held).poll_write(&mut cx, &full[..10]);
            assert!(poll.is_pending(), "the next batch's small write is held");
        });
        assert_eq!(*writes.0.lock().unwrap(), [RECORD, 10]);
    }
}
