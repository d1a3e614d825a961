//! Query builders that never name a prepared statement.
//!
//! sqlx names and caches statements by default; a named statement outlives the transaction and breaks behind
//! PgBouncer in transaction mode. Every statement of this workspace goes through these builders, which send
//! an unnamed statement, and runs inside a [`crate::Tx`].

use std::fmt::Write as _;

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

/// The signature, flags and header extension that open every `COPY` in PostgreSQL's binary format.
const BINARY_COPY_HEADER: &[u8] = b"PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0";

/// Microseconds from the Unix epoch to PostgreSQL's (2000-01-01), where a `timestamptz` counts from.
const POSTGRES_EPOCH_UNIX_MICROS: i64 = 946_684_800_000_000;

/// A `timestamptz` column of `row` in whole milliseconds since the Unix epoch, rounded down (what
/// [`CopyRows::timestamp_ms`] writes, read back). sqlx asks for every result in binary, where a `timestamptz` is
/// eight bytes of microseconds since PostgreSQL's epoch, which it decodes as a `bigint` when asked without the
/// check of the column's type. Cheaper for the server than `floor(extract(epoch FROM ...) * 1000)`, which works
/// in `numeric`.
pub(crate) fn timestamp_ms<I>(row: &PgRow, column: I) -> crate::Result<i64>
where
    I: sqlx::ColumnIndex<PgRow> + std::fmt::Debug,
{
    use sqlx::Row as _;
    let micros: i64 = row.try_get_unchecked(&column)?;
    micros
        .checked_add(POSTGRES_EPOCH_UNIX_MICROS)
        .map(|micros| micros.div_euclid(1_000))
        .ok_or_else(|| crate::Error::Internal(format!("the instant in column {column:?} is out of range")))
}

/// The type of a `text[]` array's elements.
const TEXT_OID: i32 = 25;

/// Rows for `COPY ... FROM STDIN (FORMAT binary)`, written field by field: for a bulk write of many rows, which the
/// server takes more cheaply than the same rows passed as arrays and unnested, and more cheaply in binary than as
/// text (no number, instant or escape to parse). Every field is its length and its bytes, so no value can change
/// the statement or the rows' shape. Each method names the column's type exactly, since the server reads a binary
/// field by the column's type and refuses one of another width.
#[derive(Debug)]
pub struct CopyRows {
    data: Vec<u8>,
    /// Where the current row's field count is written, while a row is open.
    row_start: Option<usize>,
    fields: i16,
    rows: u64,
}

impl Default for CopyRows {
    fn default() -> Self {
        Self::new()
    }
}

impl CopyRows {
    pub fn new() -> Self {
        Self { data: BINARY_COPY_HEADER.to_vec(), row_start: None, fields: 0, rows: 0 }
    }

    /// Starts a field of `len` bytes (-1: NULL), opening a row first if none is open.
    fn field(&mut self, len: i32) -> &mut Self {
        if self.row_start.is_none() {
            self.row_start = Some(self.data.len());
            self.data.extend_from_slice(&0i16.to_be_bytes());
        }
        self.fields += 1;
        self.data.extend_from_slice(&len.to_be_bytes());
        self
    }

    fn bytes(&mut self, value: &[u8]) -> &mut Self {
        // PostgreSQL keeps no value over 1 GB and refuses a field that long; one past what a length can say is
        // written with the largest length, which it refuses the same way.
        self.field(i32::try_from(value.len()).unwrap_or(i32::MAX));
        self.data.extend_from_slice(value);
        self
    }

    /// A NULL, whatever the column's type.
    pub fn null(&mut self) -> &mut Self {
        self.field(-1)
    }

    /// A `text` field (`None`: NULL).
    pub fn text(&mut self, value: Option<&str>) -> &mut Self {
        match value {
            Some(value) => self.bytes(value.as_bytes()),
            None => self.null(),
        }
    }

    /// A `json` field (not `jsonb`, whose binary form starts with a version byte): the document's text.
    pub fn json(&mut self, document: &str) -> &mut Self {
        self.bytes(document.as_bytes())
    }

    /// An `integer` field.
    pub fn int4(&mut self, value: i32) -> &mut Self {
        self.field(4).data.extend_from_slice(&value.to_be_bytes());
        self
    }

    /// A `bigint` field.
    pub fn int8(&mut self, value: i64) -> &mut Self {
        self.field(8).data.extend_from_slice(&value.to_be_bytes());
        self
    }

    /// A `bigint` field, or NULL.
    pub fn opt_int8(&mut self, value: Option<i64>) -> &mut Self {
        match value {
            Some(value) => self.int8(value),
            None => self.null(),
        }
    }

    /// An `xid8` field (a 64-bit transaction id).
    pub fn xid8(&mut self, value: u64) -> &mut Self {
        self.field(8).data.extend_from_slice(&value.to_be_bytes());
        self
    }

    /// A position as the event log's three key columns: `log_epoch` (`integer`), `txid` (`xid8`), `seq`
    /// (`bigint`).
    pub fn position(&mut self, position: &crate::Position) -> &mut Self {
        let (epoch, txid, seq) = position.columns();
        self.int4(epoch).xid8(txid).int8(seq)
    }

    /// A `timestamptz` field from milliseconds since the Unix epoch.
    pub fn timestamp_ms(&mut self, ms: i64) -> crate::Result<&mut Self> {
        let micros = ms
            .checked_mul(1_000)
            .and_then(|micros| micros.checked_sub(POSTGRES_EPOCH_UNIX_MICROS))
            .ok_or_else(|| crate::Error::Internal(format!("the instant {ms} ms cannot be written")))?;
        self.field(8).data.extend_from_slice(&micros.to_be_bytes());
        Ok(self)
    }

    /// A `text[]` field of one dimension (empty: `{}`).
    pub fn text_array(&mut self, items: &[impl AsRef<str>]) -> &mut Self {
        let mut array = Vec::with_capacity(20 + items.iter().map(|item| 4 + item.as_ref().len()).sum::<usize>());
        let dimensions: i32 = if items.is_empty() { 0 } else { 1 };
        array.extend_from_slice(&dimensions.to_be_bytes());
        array.extend_from_slice(&0i32.to_be_bytes()); // no NULL element
        array.extend_from_slice(&TEXT_OID.to_be_bytes());
        if !items.is_empty() {
            array.extend_from_slice(&i32::try_from(items.len()).unwrap_or(i32::MAX).to_be_bytes());
            array.extend_from_slice(&1i32.to_be_bytes()); // the lower bound
        }
        for item in items {
            let item = item.as_ref().as_bytes();
            array.extend_from_slice(&i32::try_from(item.len()).unwrap_or(i32::MAX).to_be_bytes());
            array.extend_from_slice(item);
        }
        self.bytes(&array)
    }

    /// Ends the current row.
    pub fn end_row(&mut self) {
        if let Some(at) = self.row_start.take() {
            self.data[at..at + 2].copy_from_slice(&self.fields.to_be_bytes());
        } else {
            // A row of no fields.
            self.data.extend_from_slice(&0i16.to_be_bytes());
        }
        self.fields = 0;
        self.rows += 1;
    }

    /// The rows ended so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Sends the rows with `statement` (a `COPY <table> (<columns>) FROM STDIN (FORMAT binary)`) in `tx`. Returns
    /// the rows the server wrote, which must be the rows ended (an unfinished row is an error, and sends nothing).
    pub async fn copy_in(mut self, tx: &mut crate::Tx, statement: &'static str) -> crate::Result<u64> {
        if self.row_start.is_some() {
            return Err(crate::Error::Internal("a COPY row was left unfinished".to_owned()));
        }
        if self.rows == 0 {
            return Ok(0);
        }
        // The trailer: a row whose field count is -1.
        self.data.extend_from_slice(&(-1i16).to_be_bytes());
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
