//! Minimal HTTP/1.1 responder for throughput benches: answers every request `200 OK` at
//! once and closes, on `--threads` threads accepting from one listener with blocking I/O.
//! About the least a server can do per connection, so a connection-per-request bench
//! measures the network path rather than the server.
//!
//! Prints "ready" once listening. A connection that sends no request head within
//! [`READ_TIMEOUT`] (or resets, as `lbd`'s TCP health checks do) is closed unanswered.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;

/// Connection-per-request HTTP responder.
#[derive(Parser)]
struct Args {
    /// Address to listen on, e.g. `0.0.0.0:8080`.
    #[arg(long)]
    listen: SocketAddr,
    /// Threads accepting and answering.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    threads: u32,
}

const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n";
const MAX_REQUEST: usize = 4096;
const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause after a failed accept (e.g. out of file descriptors) before retrying.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

fn main() -> Result<()> {
    let args = Args::parse();
    let listener = TcpListener::bind(args.listen).with_context(|| format!("listening on {}", args.listen))?;
    let threads: Vec<_> = (0..args.threads)
        .map(|_| {
            let listener = listener.try_clone()?;
            Ok(std::thread::spawn(move || serve(&listener)))
        })
        .collect::<Result<_>>()?;
    println!("ready");
    std::io::stdout().flush()?;
    for thread in threads {
        let _ = thread.join();
    }
    bail!("every serving thread stopped")
}

fn serve(listener: &TcpListener) {
    loop {
        match listener.accept() {
            // A client that went away is its own business: nothing to log.
            Ok((conn, _)) => drop(answer(conn)),
            Err(err) => {
                eprintln!("accept: {err}");
                std::thread::sleep(ACCEPT_BACKOFF);
            }
        }
    }
}

/// Reads up to the end of the request head, answers, closes.
fn answer(mut conn: TcpStream) -> std::io::Result<()> {
    conn.set_read_timeout(Some(READ_TIMEOUT))?;
    let mut head = [0u8; MAX_REQUEST];
    let mut len = 0;
    while !head[..len].windows(4).any(|w| w == b"\r\n\r\n") {
        if len == head.len() {
            return Ok(());
        }
        match conn.read(&mut head[len..])? {
            0 => return Ok(()),
            n => len += n,
        }
    }
    conn.write_all(RESPONSE)
}
