//! Query builders that never name a prepared statement.
//!
//! sqlx names and caches statements by default; a named statement outlives the transaction and breaks behind
//! PgBouncer in transaction mode. Every statement of this workspace goes through these builders, which send
//! an unnamed statement, and runs inside a [`crate::Tx`].

use std::fmt::Write as _;
use std::io::Write as _;

use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::{Query, QueryAs, QueryScalar};
use sqlx::{FromRow, Postgres};

/// `sqlx::query`, unnamed.
pub fn query(sql: &'static str) -> Query<'static, Postgres, PgArguments> {
    sqlx::query(sql).persistent(false)
}

/// `sqlx::query_as`, unnamed.
pub fn query_as<O>(sql: &'static str) -> QueryAs<'static, Postgres, O, PgArguments>
where
    O: for<'r> FromRow<'r, PgRow>,
{
    sqlx::query_as(sql).persistent(false)
}

/// `sqlx::query_scalar`, unnamed.
pub fn query_scalar<O>(sql: &'static str) -> QueryScalar<'static, Postgres, O, PgArguments>
where
    (O,): for<'r> FromRow<'r, PgRow>,
{
    sqlx::query_scalar(sql).persistent(false)
}

/// A call of a server-side function sent in the simple query protocol, so that it can share a round trip with
/// the statements around it ([`crate::Db::begin_with`], [`crate::Tx::commit_with`]). Its arguments are written
/// into the text as literals that no value can end early: a text is an escape string (`E'…'`) of printable ASCII
/// whose quotes and backslashes are doubled and whose every other character is a Unicode escape, so the statement
/// is ASCII whatever the connection's encoding; numbers are digits and casts. The function's own plans are kept by
/// PostgreSQL for the session, as for any function. The function's result comes back as text (`::text`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    function: &'static str,
    args: Vec<String>,
}

/// A text value as an escape string literal of printable ASCII: a quote is doubled, a backslash doubled, and every
/// other character outside printable ASCII written as a Unicode escape (`\uXXXX`, `\UXXXXXXXX`), which the server
/// turns back into the character in its own encoding. The server parses such a literal as a constant of the type it
/// is cast to; the earlier form, `convert_from(decode('…', 'hex'), 'UTF8')`, cost two function lookups per value
/// when the statement was analysed and their evaluation when it was planned (about 2% of all CPU under sixteen
/// clients, measured with perf). A text holding NUL, which PostgreSQL cannot store, is still written in that form,
/// so the server refuses it exactly as before.
fn text_literal(value: &str) -> String {
    typed_literal(value, "text")
}

/// `value` as a literal of `type_name`, which reads it from its text form (see [`text_literal`]).
fn typed_literal(value: &str, type_name: &str) -> String {
    if value.contains('\0') {
        let text =
            format!("(convert_from(decode('{}', 'hex'), 'UTF8') COLLATE \"default\")", hex::encode(value.as_bytes()));
        return if type_name == "text" { text } else { format!("{text}::{type_name}") };
    }
    let mut out = String::with_capacity(value.len() + 10);
    out.push_str("E'");
    for c in value.chars() {
        match c {
            '\'' => out.push_str("''"),
            '\\' => out.push_str("\\\\"),
            ' '..='~' => out.push(c),
            // Writing into a String cannot fail.
            c if u32::from(c) <= 0xFFFF => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => {
                let _ = write!(out, "\\U{:08x}", u32::from(c));
            }
        }
    }
    out.push_str("'::");
    out.push_str(type_name);
    out
}

impl Call {
    /// A call of `function`, a plain lower-case name.
    pub fn new(function: &'static str) -> Call {
        assert!(
            !function.is_empty() && function.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
            "{function:?} is not a plain function name"
        );
        Call { function, args: Vec::new() }
    }

    fn push(mut self, arg: String) -> Call {
        self.args.push(arg);
        self
    }

    pub fn text(self, value: &str) -> Call {
        self.push(text_literal(value))
    }

    pub fn opt_text(self, value: Option<&str>) -> Call {
        match value {
            Some(value) => self.text(value),
            None => self.push("NULL::text".to_owned()),
        }
    }

    /// A JSON document, as `jsonb`.
    pub fn jsonb(self, json: &str) -> Call {
        self.push(typed_literal(json, "jsonb"))
    }

    pub fn int8(self, value: i64) -> Call {
        self.push(format!("{value}::int8"))
    }

    pub fn opt_int8(self, value: Option<i64>) -> Call {
        match value {
            Some(value) => self.int8(value),
            None => self.push("NULL::int8".to_owned()),
        }
    }

    pub fn opt_int4(self, value: Option<i32>) -> Call {
        match value {
            Some(value) => self.int4(value),
            None => self.push("NULL::int4".to_owned()),
        }
    }

    pub fn int4(self, value: i32) -> Call {
        self.push(format!("{value}::int4"))
    }

    /// A finite float (an infinite or NaN one is written as PostgreSQL reads those).
    pub fn float8(self, value: f64) -> Call {
        let text = if value.is_nan() {
            "'NaN'".to_owned()
        } else if value.is_infinite() {
            if value > 0.0 { "'Infinity'".to_owned() } else { "'-Infinity'".to_owned() }
        } else {
            format!("{value:?}")
        };
        self.push(format!("{text}::float8"))
    }

    pub fn boolean(self, value: bool) -> Call {
        self.push(if value { "true" } else { "false" }.to_owned())
    }

    pub fn int4s(self, values: &[i32]) -> Call {
        let items: Vec<String> = values.iter().map(i32::to_string).collect();
        self.push(format!("ARRAY[{}]::int4[]", items.join(", ")))
    }

    pub fn opt_int8s(self, values: &[Option<i64>]) -> Call {
        let items: Vec<String> =
            values.iter().map(|v| v.map_or_else(|| "NULL".to_owned(), |v| v.to_string())).collect();
        self.push(format!("ARRAY[{}]::int8[]", items.join(", ")))
    }

    pub fn texts(self, values: &[&str]) -> Call {
        let items: Vec<String> = values.iter().map(|v| text_literal(v)).collect();
        self.push(format!("ARRAY[{}]::text[]", items.join(", ")))
    }

    pub fn int2s(self, values: &[i16]) -> Call {
        let items: Vec<String> = values.iter().map(i16::to_string).collect();
        self.push(format!("ARRAY[{}]::int2[]", items.join(", ")))
    }

    pub fn byteas(self, values: &[&[u8]]) -> Call {
        // `E'\\x…'` is the text `\x…`, which bytea reads as hexadecimal.
        let items: Vec<String> = values.iter().map(|v| format!("E'\\\\x{}'", hex::encode(v))).collect();
        self.push(format!("ARRAY[{}]::bytea[]", items.join(", ")))
    }

    /// The statement: `SELECT function(args)::text`.
    pub fn statement(&self) -> String {
        format!("SELECT {}({})::text", self.function, self.args.join(", "))
    }
}

/// Rows for `COPY ... FROM STDIN` in PostgreSQL's text format, written field by field: for a bulk write of many
/// rows, which the server parses more cheaply than the same rows passed as arrays and unnested. Every value is
/// escaped (a backslash, tab, newline or carriage return in a text cannot end a field or a row), so no value can
/// change the statement or the rows' shape.
#[derive(Debug, Default)]
pub struct CopyRows {
    data: Vec<u8>,
    row_open: bool,
    rows: u64,
}

impl CopyRows {
    pub fn new() -> Self {
        Self::default()
    }

    fn separate(&mut self) {
        if self.row_open {
            self.data.push(b'\t');
        }
        self.row_open = true;
    }

    /// A text field (`None`: NULL).
    pub fn text(&mut self, value: Option<&str>) -> &mut Self {
        self.separate();
        let Some(value) = value else {
            self.data.extend_from_slice(b"\\N");
            return self;
        };
        // Copies the runs between the bytes that need escaping whole.
        let bytes = value.as_bytes();
        let mut run = 0;
        for (at, byte) in bytes.iter().enumerate() {
            let escaped: &[u8] = match byte {
                b'\\' => b"\\\\",
                b'\t' => b"\\t",
                b'\n' => b"\\n",
                b'\r' => b"\\r",
                _ => continue,
            };
            self.data.extend_from_slice(&bytes[run..at]);
            self.data.extend_from_slice(escaped);
            run = at + 1;
        }
        self.data.extend_from_slice(&bytes[run..]);
        self
    }

    /// An integer field (also for an `xid8` or `numeric` column).
    pub fn int(&mut self, value: impl Into<i128>) -> &mut Self {
        self.separate();
        // Writing into a Vec cannot fail.
        let _ = write!(self.data, "{}", value.into());
        self
    }

    /// A `timestamptz` field from milliseconds since the Unix epoch, written in UTC (RFC 3339).
    pub fn timestamp_ms(&mut self, ms: i64) -> crate::Result<&mut Self> {
        let at = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
            .map_err(|err| crate::Error::Internal(format!("the instant {ms} ms cannot be written: {err}")))?;
        let text = at
            .format(&time::format_description::well_known::Rfc3339)
            .map_err(|err| crate::Error::Internal(format!("the instant {ms} ms cannot be written: {err}")))?;
        Ok(self.text(Some(&text)))
    }

    /// Ends the current row.
    pub fn end_row(&mut self) {
        self.data.push(b'\n');
        self.row_open = false;
        self.rows += 1;
    }

    /// The rows ended so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Sends the rows with `statement` (a `COPY <table> (<columns>) FROM STDIN`, text format) in `tx`. Returns the
    /// rows the server wrote, which must be the rows ended (an unfinished row is an error, and sends nothing).
    pub async fn copy_in(self, tx: &mut crate::Tx, statement: &'static str) -> crate::Result<u64> {
        if self.row_open {
            return Err(crate::Error::Internal("a COPY row was left unfinished".to_owned()));
        }
        if self.rows == 0 {
            return Ok(0);
        }
        let mut copy = tx.conn().copy_in_raw(statement).await?;
        if let Err(err) = copy.send(self.data).await {
            // The connection must leave the COPY state either way; the transaction is aborted by the error.
            let _ = copy.abort("the rows could not be sent").await;
            return Err(err.into());
        }
        let written = copy.finish().await?;
        if written != self.rows {
            return Err(crate::Error::Internal(format!("COPY wrote {written} rows of {}", self.rows)));
        }
        Ok(written)
    }
}

#[cfg(test)]
mod tests {
    use super::Call;

    #[test]
    fn a_call_writes_every_value_as_an_ascii_literal_or_digits_and_casts() {
        let call = Call::new("f")
            .text(r"x'); DROP TABLE events; -- \'")
            .opt_text(None)
            .int8(-5)
            .boolean(true)
            .texts(&["a", "é\n", "🚀"])
            .int2s(&[1, 2])
            .int4s(&[-3])
            .float8(1.5)
            .opt_int8s(&[Some(7), None])
            .byteas(&[b"\x00\xff"])
            .jsonb(r#"{"k": "it's"}"#);
        assert_eq!(
            call.statement(),
            concat!(
                r"SELECT f(E'x''); DROP TABLE events; -- \\'''::text, NULL::text, -5::int8, true, ",
                r"ARRAY[E'a'::text, E'\u00e9\u000a'::text, E'\U0001f680'::text]::text[], ARRAY[1, 2]::int2[], ",
                r"ARRAY[-3]::int4[], 1.5::float8, ARRAY[7, NULL]::int8[], ARRAY[E'\\x00ff']::bytea[], ",
                r#"E'{"k": "it''s"}'::jsonb)::text"#,
            )
        );
        assert!(call.statement().is_ascii());
    }

    #[test]
    fn a_text_holding_nul_is_written_as_before_for_the_server_to_refuse() {
        assert_eq!(
            Call::new("f").text("a\0").jsonb("\0").statement(),
            concat!(
                r#"SELECT f((convert_from(decode('6100', 'hex'), 'UTF8') COLLATE "default"), "#,
                r#"(convert_from(decode('00', 'hex'), 'UTF8') COLLATE "default")::jsonb)::text"#,
            )
        );
    }

    #[test]
    #[should_panic(expected = "not a plain function name")]
    fn a_function_name_is_never_anything_but_a_name() {
        let _ = Call::new("f(); DROP TABLE events; SELECT g");
    }
}
