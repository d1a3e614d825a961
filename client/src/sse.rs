//! The event stream (`GET /v1/events`, server-sent events) read as typed events: each `data:` is an
//! [`EventDto`], each `id:` its position to resume after; the stream's own notices (`cut-off`, `closing`,
//! `error`) say where to resume.

use bc_wire::ops::EventDto;

use crate::{Error, encode};

/// What to follow: from after a position (the log's start when `after` is `"0-0-0"`, what commits from now
/// on when `None`), of one stream, of some event types.
#[derive(Debug, Clone, Default)]
pub struct StreamQuery {
    pub after: Option<String>,
    pub stream: Option<String>,
    /// Comma-separated types or families (`reservation.*`).
    pub types: Option<String>,
}

impl StreamQuery {
    /// Every event from the start of the log.
    pub fn from_start() -> Self {
        Self { after: Some("0-0-0".to_owned()), ..Self::default() }
    }

    pub(crate) fn path(&self) -> String {
        let mut params = vec!["eventName=message".to_owned()];
        if let Some(after) = &self.after {
            params.push(format!("after={}", encode(after)));
        }
        if let Some(stream) = &self.stream {
            params.push(format!("stream={}", encode(stream)));
        }
        if let Some(types) = &self.types {
            params.push(format!("types={}", encode(types)));
        }
        format!("/v1/events?{}", params.join("&"))
    }
}

/// One thing the stream said.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    Event(Box<EventDto>),
    /// The server ended the stream (a slow reader, a restart): open it again after `resume_after`.
    Notice {
        name: String,
        data: String,
    },
}

/// An open event stream.
#[derive(Debug)]
pub struct EventStream {
    response: reqwest::Response,
    server: String,
    buffer: Vec<u8>,
    parser: Parser,
}

/// The server-sent events format, a line at a time: the fields of the message being read.
#[derive(Debug, Default)]
struct Parser {
    event: Option<String>,
    data: String,
}

impl EventStream {
    pub(crate) fn new(response: reqwest::Response, server: String) -> Self {
        Self { response, server, buffer: Vec::new(), parser: Parser::default() }
    }

    /// The next item, or `None` when the server closed the stream.
    pub async fn next(&mut self) -> Result<Option<Item>, Error> {
        loop {
            while let Some(end) = self.buffer.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                let line = String::from_utf8_lossy(&line);
                let line = line.trim_end_matches(['\n', '\r']);
                if let Some(item) = self.parser.line(line)? {
                    return Ok(Some(item));
                }
            }
            match self.response.chunk().await {
                Ok(Some(bytes)) => self.buffer.extend_from_slice(&bytes),
                Ok(None) => return Ok(None),
                Err(source) => return Err(Error::Transport { server: self.server.clone(), source }),
            }
        }
    }
}

impl Parser {
    /// Takes one line; a blank line ends a message.
    fn line(&mut self, line: &str) -> Result<Option<Item>, Error> {
        if line.is_empty() {
            let event = self.event.take();
            let data = std::mem::take(&mut self.data);
            if data.is_empty() {
                return Ok(None);
            }
            return match event.as_deref() {
                None | Some("message") => serde_json::from_str::<EventDto>(&data)
                    .map(|event| Some(Item::Event(Box::new(event))))
                    .map_err(|err| Error::Decode { what: "an event of the stream".into(), reason: err.to_string() }),
                Some(name) => Ok(Some(Item::Notice { name: name.to_owned(), data })),
            };
        }
        if line.starts_with(':') {
            return Ok(None);
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "event" => self.event = Some(value.to_owned()),
            "data" => {
                if !self.data.is_empty() {
                    self.data.push('\n');
                }
                self.data.push_str(value);
            }
            _ => {}
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(text: &str) -> Vec<Result<Item, Error>> {
        let mut parser = Parser::default();
        text.split('\n').filter_map(|line| parser.line(line).transpose()).collect()
    }

    #[test]
    fn events_notices_and_comments_are_told_apart() {
        let event = r#"{"position":"1-2-3","streamId":"rsv_x","streamVersion":1,"eventType":"reservation.requested","schemaVersion":1,"tenantId":"acme","recordedAt":5,"payload":{},"metadata":{}}"#;
        let text = format!(
            ": keep-alive\n\nid: 1-2-3\ndata: {event}\n\nevent: cut-off\ndata: {{\"resumeAfter\":\"1-2-3\"}}\n\n"
        );
        let items = feed(&text);
        assert_eq!(items.len(), 2, "{items:?}");
        match &items[0] {
            Ok(Item::Event(event)) => {
                assert_eq!((event.position.as_str(), event.stream_version), ("1-2-3", 1));
                assert_eq!(event.event_type, "reservation.requested");
            }
            other => panic!("not an event: {other:?}"),
        }
        match &items[1] {
            Ok(Item::Notice { name, data }) => {
                assert_eq!((name.as_str(), data.as_str()), ("cut-off", "{\"resumeAfter\":\"1-2-3\"}"))
            }
            other => panic!("not a notice: {other:?}"),
        }
    }

    #[test]
    fn data_over_several_lines_is_one_message_and_a_bad_event_is_named() {
        let items = feed("event: closing\ndata: a\ndata: b\n\ndata: {not json\n\n");
        match &items[0] {
            Ok(Item::Notice { data, .. }) => assert_eq!(data, "a\nb"),
            other => panic!("{other:?}"),
        }
        match &items[1] {
            Err(Error::Decode { what, .. }) => assert_eq!(what, "an event of the stream"),
            other => panic!("{other:?}"),
        }
    }
}
