//! The blocking client `lbctl` uses: one request per connection.

use std::{
    io::{self, BufRead, BufReader, Write},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    time::Duration,
};

use super::{ApiError, ErrorKind, Reply, Request, Response};

/// Generous: the first change to a VIP can rewrite a 65537-slot table.
const TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("lbd is not running (no socket at {})", path.display())]
    NotRunning { path: PathBuf },
    #[error("permission denied on {}: you must be root to use lbctl", path.display())]
    PermissionDenied { path: PathBuf },
    #[error("talking to lbd at {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("lbd at {} closed the connection without answering", path.display())]
    NoAnswer { path: PathBuf },
    #[error("lbd sent a response this lbctl does not understand")]
    Protocol(#[source] serde_json::Error),
    #[error("permission denied: {0} (you must be root to use lbctl)")]
    Refused(ApiError),
    #[error("{0}")]
    Api(ApiError),
}

/// Sends `request` to the server at `path` and returns its reply.
pub fn call(path: &Path, request: &Request) -> Result<Reply, ClientError> {
    let io_error = |source: io::Error| ClientError::Io { path: path.to_owned(), source };
    let stream = UnixStream::connect(path).map_err(|source| match source.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => ClientError::NotRunning { path: path.to_owned() },
        io::ErrorKind::PermissionDenied => ClientError::PermissionDenied { path: path.to_owned() },
        _ => io_error(source),
    })?;
    stream.set_read_timeout(Some(TIMEOUT)).map_err(io_error)?;
    stream.set_write_timeout(Some(TIMEOUT)).map_err(io_error)?;
    let mut line = serde_json::to_string(request).map_err(ClientError::Protocol)?;
    line.push('\n');
    let sent = (&stream).write_all(line.as_bytes());
    // A server refusing the peer answers without reading the request, so the write may
    // fail with the answer already waiting: read it either way.
    let mut answer = String::new();
    let received = BufReader::new(&stream).read_line(&mut answer);
    if answer.is_empty() {
        return Err(match sent.and(received) {
            Err(e) => io_error(e),
            Ok(_) => ClientError::NoAnswer { path: path.to_owned() },
        });
    }
    match serde_json::from_str(&answer).map_err(ClientError::Protocol)? {
        Response::Ok(reply) => Ok(reply),
        Response::Error(e) if e.kind == ErrorKind::PermissionDenied => Err(ClientError::Refused(e)),
        Response::Error(e) => Err(ClientError::Api(e)),
    }
}
