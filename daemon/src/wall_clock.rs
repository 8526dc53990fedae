//! The wall clock, read in one place: what is persisted or shared between balancers (drain
//! deadlines, backends' starts, health snapshots) outlives the process, so it is kept in
//! Unix time, not in a monotonic clock.

/// Wall-clock milliseconds since the Unix epoch (drain deadlines outlive the process).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
