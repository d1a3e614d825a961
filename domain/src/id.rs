//! Generated ids: `<prefix>_<ulid>` in lower-case Crockford base32, monotonic within a process.

use std::sync::Mutex;

use ulid::{Generator, Ulid};

/// The process-wide ULID generator. ULIDs made in the same millisecond still sort in creation order,
/// because the generator increments the random part instead of drawing a new one.
static GENERATOR: Mutex<Option<Generator>> = Mutex::new(None);

/// A new ULID, greater than every ULID this process made before.
pub fn new_ulid() -> Ulid {
    let mut guard = GENERATOR.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let generator = guard.get_or_insert_with(Generator::new);
    match generator.generate() {
        Ok(ulid) => ulid,
        // 2^80 ids in one millisecond overflow the random part; the next millisecond starts afresh.
        Err(_) => {
            std::thread::sleep(std::time::Duration::from_millis(1));
            generator.generate().unwrap_or_else(|_| Ulid::new())
        }
    }
}

/// A new id such as `site_01jd8w2k3m4n5p6q7r8s9t0v1w`: the prefix, an underscore and a lower-case ULID.
pub fn new_id(prefix: &str) -> String {
    let mut id = String::with_capacity(prefix.len() + 27);
    id.push_str(prefix);
    id.push('_');
    id.push_str(&new_ulid().to_string().to_ascii_lowercase());
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_carry_prefix_and_lower_case_ulid() {
        let id = new_id("site");
        let body = id.strip_prefix("site_").expect("prefix");
        assert_eq!(body.len(), 26);
        assert!(body.chars().all(|c| c.is_ascii_digit() || c.is_ascii_lowercase()));
        assert!(!body.contains(['i', 'l', 'o', 'u']));
    }

    #[test]
    fn ids_made_in_a_burst_sort_in_creation_order() {
        let ids: Vec<String> = (0..10_000).map(|_| new_id("evt")).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted);
    }
}
