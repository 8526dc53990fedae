//! The API socket: root only (mode 0600 and the peer's uid checked), one request per
//! connection, requests handled one at a time by the core.

use std::{
    fs::{self, DirBuilder},
    future::Future,
    io,
    os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{UnixListener, UnixStream},
    sync::Notify,
    task::JoinSet,
};

use super::core::{Core, Counters};
use crate::store::Store;
use spillway_api::{ApiError, ErrorKind, MAX_REQUEST_BYTES, Request, Response};
use spillway_logging::event;
use spillway_reconcile::Maps;

/// A client gets this long to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// On shutdown, how long requests in flight may take to finish.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("another lbd is already serving {}", path.display())]
    InUse { path: PathBuf },
    #[error("{} exists and is not a socket; refusing to replace it", path.display())]
    NotASocket { path: PathBuf },
    #[error("creating the API socket {}", path.display())]
    Bind {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The socket's file, removed when dropped so that only a killed daemon leaves one behind.
pub struct SocketFile(PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_file(&self.0) {
            event!(warn, "api_socket_remove_failed", path = self.0.display(), error = e);
        }
    }
}

/// Binds the socket at `path` (mode 0600), creating its directory (0700) if missing and
/// replacing a stale socket left by a daemon that died.
pub fn bind(path: &Path) -> Result<(UnixListener, SocketFile), ServerError> {
    let bind_error = |source| ServerError::Bind { path: path.to_owned(), source };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
        DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(bind_error)?;
    }
    if let Ok(meta) = path.symlink_metadata() {
        if !meta.file_type().is_socket() {
            return Err(ServerError::NotASocket { path: path.to_owned() });
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(ServerError::InUse { path: path.to_owned() });
        }
        fs::remove_file(path).map_err(bind_error)?;
    }
    let listener = UnixListener::bind(path).map_err(bind_error)?;
    let file = SocketFile(path.to_owned());
    fs::set_permissions(path, fs::Permissions::from_mode(0o600)).map_err(bind_error)?;
    Ok((listener, file))
}

pub type SharedCore<M, S> = Arc<Mutex<Core<M, S>>>;

/// Locks the core; a panic in an earlier request does not wedge the daemon.
pub fn lock<M, S>(core: &Mutex<Core<M, S>>) -> MutexGuard<'_, Core<M, S>> {
    core.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Answers connections until `shutdown` completes, then lets requests in flight finish.
/// `answered` is notified after every request the core accepted (e.g. to resolve a new
/// backend's neighbour at once).
pub async fn serve<M, S>(listener: UnixListener, core: SharedCore<M, S>, answered: Arc<Notify>, shutdown: impl Future<Output = ()>)
where
    M: Maps + Counters + Send + 'static,
    S: Store + Send + 'static,
{
    tokio::pin!(shutdown);
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(connection(stream, core.clone(), answered.clone()));
                }
                Err(e) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    event!(warn, "api_accept_failed", error = e);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
    drop(listener);
    // A change being applied completes either way; this also delivers its answer.
    let drained = tokio::time::timeout(DRAIN_TIMEOUT, async { while connections.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        event!(warn, "api_drain_timeout", connections = connections.len(), after_s = DRAIN_TIMEOUT.as_secs(), message = "closing them");
    }
}

async fn connection<M, S>(mut stream: UnixStream, core: SharedCore<M, S>, answered: Arc<Notify>)
where
    M: Maps + Counters + Send + 'static,
    S: Store + Send + 'static,
{
    let response = answer(&mut stream, core).await;
    if matches!(response, Response::Ok(_)) {
        answered.notify_one();
    }
    let mut line = match serde_json::to_string(&response) {
        Ok(line) => line,
        Err(e) => return event!(warn, "api_encode_failed", error = e),
    };
    line.push('\n');
    if let Err(e) = stream.write_all(line.as_bytes()).await {
        event!(debug, "api_write_failed", error = e);
    }
}

fn error(kind: ErrorKind, message: String) -> Response {
    Response::Error(ApiError { kind, message })
}

async fn answer<M, S>(stream: &mut UnixStream, core: SharedCore<M, S>) -> Response
where
    M: Maps + Counters + Send + 'static,
    S: Store + Send + 'static,
{
    let uid = match stream.peer_cred() {
        Ok(cred) => cred.uid(),
        Err(e) => return error(ErrorKind::Internal, format!("reading the peer's credentials: {e}")),
    };
    if let Err(refusal) = authorize(uid) {
        event!(warn, "api_refused", uid = uid);
        return Response::Error(refusal);
    }
    let request = match tokio::time::timeout(READ_TIMEOUT, read_request(stream)).await {
        Ok(Ok(request)) => request,
        Ok(Err(refusal)) => return Response::Error(refusal),
        Err(_) => return error(ErrorKind::BadRequest, format!("no request within {}s", READ_TIMEOUT.as_secs())),
    };
    // Map updates are blocking syscalls; the core's lock serializes requests.
    match tokio::task::spawn_blocking(move || lock(&core).handle(request)).await {
        Ok(Ok(reply)) => Response::Ok(reply),
        Ok(Err(e)) => Response::Error(e.to_api()),
        Err(e) => error(ErrorKind::Internal, format!("the request handler failed: {e}")),
    }
}

fn authorize(uid: u32) -> Result<(), ApiError> {
    if uid == 0 {
        return Ok(());
    }
    Err(ApiError { kind: ErrorKind::PermissionDenied, message: format!("the Spillway API is for root only (peer uid {uid})") })
}

/// Reads one line (one byte past the limit, so that a longer one is seen) and decodes it.
async fn read_request(stream: &mut UnixStream) -> Result<Request, ApiError> {
    let mut line = Vec::new();
    let limited = (&mut *stream).take(MAX_REQUEST_BYTES as u64 + 1);
    BufReader::new(limited)
        .read_until(b'\n', &mut line)
        .await
        .map_err(|e| ApiError { kind: ErrorKind::BadRequest, message: format!("reading the request: {e}") })?;
    Request::decode(&line)
}

#[cfg(test)]
mod tests {
    use std::{io::Write, os::unix::net::UnixStream as StdStream};

    use super::*;
    use crate::{
        store::StateFile,
        testing::{FakeMaps, TempDir},
    };
    use spillway_api::{Reply, VipList, client};
    use spillway_model::DesiredState;
    use spillway_model::{Encap, HashMode};

    async fn start(tmp: &TempDir) -> (PathBuf, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
        let socket = tmp.path().join("run/api.sock");
        let store = StateFile::open(&tmp.path().join("state")).unwrap();
        let (core, _) = Core::start(FakeMaps::default(), store, DesiredState::default(), None).unwrap();
        let (listener, file) = bind(&socket).unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            serve(listener, Arc::new(Mutex::new(core)), Arc::new(Notify::new()), async {
                let _ = stopped.await;
            })
            .await;
            drop(file);
        });
        (socket, stop, task)
    }

    async fn call(socket: &Path, request: Request) -> Result<Reply, client::ClientError> {
        let socket = socket.to_owned();
        tokio::task::spawn_blocking(move || client::call(&socket, &request)).await.unwrap()
    }

    async fn raw(socket: &Path, bytes: Vec<u8>) -> Response {
        let socket = socket.to_owned();
        tokio::task::spawn_blocking(move || {
            let mut s = StdStream::connect(socket).unwrap();
            s.write_all(&bytes).unwrap();
            let mut answer = String::new();
            io::BufRead::read_line(&mut io::BufReader::new(s), &mut answer).unwrap();
            serde_json::from_str(&answer).unwrap()
        })
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn serves_requests_over_the_socket() {
        let tmp = TempDir::new("server");
        let (socket, stop, task) = start(&tmp).await;
        assert_eq!(fs::metadata(&socket).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(fs::metadata(socket.parent().unwrap()).unwrap().permissions().mode() & 0o777, 0o700);
        let vip = "10.0.0.1:80/tcp".parse().unwrap();
        call(
            &socket,
            Request::AddVip {
                vip,
                ring_size: Some(13),
                force: false,
                quic: None,
                encap: Encap::Ipip,
                hash: HashMode::FiveTuple,
                source_prefix: None,
            },
        )
        .await
        .unwrap();
        let listed = call(&socket, Request::ListVips).await.unwrap();
        assert!(matches!(listed, Reply::Vips(VipList { vips, .. }) if vips.len() == 1));
        let err = call(&socket, Request::RemoveVip { vip: "10.0.0.2:80/tcp".parse().unwrap(), force: false }).await.unwrap_err();
        assert_eq!(err.to_string(), "unknown VIP 10.0.0.2:80/tcp");

        for garbage in
            [&b"{\"op\":\"frobnicate\"}\n"[..], b"not json\n", b"{\"op\":\"remove_vip\",\"vip\":\"10.0.0.1:80/tcp\",\"frobnicate\":true}\n"]
        {
            let Response::Error(e) = raw(&socket, garbage.to_vec()).await else { panic!("{garbage:?} accepted") };
            assert_eq!(e.kind, ErrorKind::BadRequest, "{garbage:?}");
        }
        let Response::Error(e) = raw(&socket, vec![b' '; MAX_REQUEST_BYTES + 10]).await else { panic!("huge request accepted") };
        assert!(e.message.contains("longer than"), "{}", e.message);

        // A second daemon on the same socket is refused while the first serves.
        assert!(matches!(bind(&socket), Err(ServerError::InUse { .. })));
        stop.send(()).unwrap();
        task.await.unwrap();
        assert!(!socket.exists(), "the socket outlived the server");
    }

    #[tokio::test]
    async fn stale_socket_is_replaced_and_other_files_are_not() {
        let tmp = TempDir::new("server-stale");
        let path = tmp.path().join("api.sock");
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let (_listener, _file) = bind(&path).unwrap();
        let file = tmp.path().join("file");
        fs::write(&file, "").unwrap();
        assert!(matches!(bind(&file), Err(ServerError::NotASocket { .. })));
    }

    #[tokio::test]
    async fn missing_socket_means_lbd_is_not_running() {
        let tmp = TempDir::new("server-none");
        let path = tmp.path().join("api.sock");
        let err = call(&path, Request::ListVips).await.unwrap_err();
        assert_eq!(err.to_string(), format!("lbd is not running (no socket at {})", path.display()));
    }

    #[test]
    fn only_root_is_served() {
        assert!(authorize(0).is_ok());
        let refusal = authorize(1000).unwrap_err();
        assert_eq!(refusal.kind, ErrorKind::PermissionDenied);
        assert!(refusal.message.contains("root only"));
    }
}
