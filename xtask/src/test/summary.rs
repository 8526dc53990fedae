//! The table that closes `cargo xtask test`: every binary, slowest first.

use std::time::Duration;

use super::schedule::Outcome;

pub fn print(outcomes: &[Outcome], wall: Duration) {
    let mut rows: Vec<&Outcome> = outcomes.iter().collect();
    rows.sort_by_key(|o| std::cmp::Reverse(o.elapsed));
    let width = rows.iter().map(|o| o.name.len()).max().unwrap_or(0).max("job".len());
    println!("\n{:<width$}  {:>5}  {:>7}  result", "job", "tests", "seconds");
    for o in rows {
        let result = if o.passed() { "ok" } else { "FAILED" };
        println!("{:<width$}  {:>5}  {:>7.1}  {result}", o.name, o.tests, o.elapsed.as_secs_f64());
    }
    let summed: Duration = outcomes.iter().map(|o| o.elapsed).sum();
    println!(
        "{} jobs, {} tests: {:.1} s wall, {:.1} s if run one after another",
        outcomes.len(),
        outcomes.iter().map(|o| o.tests).sum::<usize>(),
        wall.as_secs_f64(),
        summed.as_secs_f64()
    );
}
