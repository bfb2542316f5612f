//! A blocking query's own connection, kept small while it waits.
//!
//! A manager keeps a blocking query open on every worker it follows (`GET /tasks?index=N`,
//! answered the moment a task changes there), most of the time waiting. Through `reqwest`
//! each such connection held ~39 KB for as long as it waited (hyper's dispatch channel, the
//! connection's task, its read and write buffers, the request's futures: heaptrack,
//! BENCHMARKS.md), ~78 MB at 2,000 workers, in every manager. [`LongPoll`] speaks HTTP/1.1
//! itself on one kept-alive connection, in the caller's own task: while the query waits it
//! holds the socket (and the TLS session) and no buffer; a buffer is taken once the answer
//! starts to arrive, and let go once it is read.
//!
//! It answers as [`ApiClient`] does (the same [`ClientError`]s, [`Changes`]), for `GET` only.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::client::{ApiClient, Changes, ClientError, Unreached, changes_path, error_of};
use crate::server::{INDEX_HEADER, NODE_HEADER, OLDEST_INDEX_HEADER, SINCE_HEADER};

/// The most an answer's head (status line and headers) may take.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// The most headers an answer may have.
const MAX_HEADERS: usize = 64;
/// What the read buffer grows by at least, when full.
const READ_CHUNK: usize = 4096;

/// Blocking queries to one server on one kept-alive connection of their own (see the module
/// comment). Made by [`ApiClient::long_poll`], with that client's address, TLS settings,
/// token, node and timeout.
#[derive(Debug)]
pub struct LongPoll {
    client: ApiClient,
    connection: Option<Connection>,
}

enum Connection {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Connection::Plain(_) => "Connection::Plain",
            Connection::Tls(_) => "Connection::Tls",
        })
    }
}

impl Connection {
    async fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Connection::Plain(stream) => {
                stream.write_all(bytes).await?;
                stream.flush().await
            }
            Connection::Tls(stream) => {
                stream.write_all(bytes).await?;
                stream.flush().await
            }
        }
    }

    /// Waits until the socket has something to read, holding no buffer meanwhile.
    async fn readable(&self) -> io::Result<()> {
        match self {
            Connection::Plain(stream) => stream.readable().await,
            Connection::Tls(stream) => stream.get_ref().0.readable().await,
        }
    }

    /// Reads what there is into `buf`'s spare room (grown first when short); 0 at the end.
    async fn read_more(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        if buf.capacity() == buf.len() {
            buf.reserve(READ_CHUNK.max(buf.len()));
        }
        match self {
            Connection::Plain(stream) => stream.read_buf(buf).await,
            Connection::Tls(stream) => stream.read_buf(buf).await,
        }
    }
}

/// A whole answer.
struct Reply {
    status: StatusCode,
    index: Option<u64>,
    since: Option<u64>,
    oldest_index: Option<u64>,
    body: Vec<u8>,
    /// Whether the connection may carry the next request.
    keep_alive: bool,
}

/// Why an exchange on a connection failed.
enum Failure {
    /// The server closed the connection before a byte of the answer: on a kept-alive
    /// connection, it had closed it as idle, and the request may be sent again.
    ClosedBeforeAnswer,
    /// Anything else: the connection is dropped.
    Broken(String),
}

impl From<io::Error> for Failure {
    fn from(err: io::Error) -> Failure {
        Failure::Broken(err.to_string())
    }
}

impl ApiClient {
    /// Blocking queries to this client's server on one connection of their own (see
    /// [`LongPoll`]).
    pub fn long_poll(&self) -> LongPoll {
        LongPoll {
            client: self.clone(),
            connection: None,
        }
    }
}

impl LongPoll {
    /// [`ApiClient::get_changes`] on this connection: `GET path?index=N&wait=…&changes=true`.
    pub async fn get_changes<T: DeserializeOwned>(
        &mut self,
        path: &str,
        index: u64,
        wait: Duration,
    ) -> Result<Changes<T>, ClientError> {
        let url = self.client.url(&changes_path(path, index, wait));
        let timeout = wait + self.client.timeout();
        let reply = match tokio::time::timeout(timeout, self.exchange(&url)).await {
            Ok(reply) => reply?,
            Err(_) => {
                // Whatever was half read goes with the connection.
                self.connection = None;
                return Err(ClientError::Unreachable {
                    url,
                    reason: format!("no answer within {timeout:?}"),
                    kind: Unreached::TimedOut(timeout),
                });
            }
        };
        if !reply.status.is_success() {
            return Err(error_of(url, reply.status, reply.oldest_index, &reply.body));
        }
        let bytes: &[u8] = if reply.body.is_empty() {
            b"null"
        } else {
            &reply.body
        };
        let body = serde_json::from_slice(bytes).map_err(|err| ClientError::Decode {
            url: url.clone(),
            reason: err.to_string(),
        })?;
        Ok(Changes {
            body,
            index: reply.index,
            complete: reply.since.is_none(),
        })
    }

    /// Sends `GET url` on the kept connection (or a new one) and reads the whole answer. A
    /// kept connection the server had closed is replaced once.
    async fn exchange(&mut self, url: &str) -> Result<Reply, ClientError> {
        let head = self.request_head(url);
        let broken = |reason: String| ClientError::Unreachable {
            url: url.to_string(),
            reason,
            kind: Unreached::Broken,
        };
        let mut reused = true;
        loop {
            let mut connection = match self.connection.take() {
                Some(connection) => connection,
                None => {
                    reused = false;
                    self.connect(url).await?
                }
            };
            match round_trip(&mut connection, head.as_bytes()).await {
                Ok(reply) => {
                    if reply.keep_alive {
                        self.connection = Some(connection);
                    }
                    return Ok(reply);
                }
                Err(Failure::ClosedBeforeAnswer) if reused => continue,
                Err(Failure::ClosedBeforeAnswer) => {
                    return Err(broken("the connection was closed before an answer".into()));
                }
                Err(Failure::Broken(reason)) => return Err(broken(reason)),
            }
        }
    }

    /// The request's head: `GET` of `url`'s path and query, with the token and the node
    /// meant when there are.
    fn request_head(&self, url: &str) -> String {
        let base = self.client.base();
        let target = url.strip_prefix(base).unwrap_or(url);
        let authority = authority(base);
        let mut head =
            format!("GET {target} HTTP/1.1\r\nHost: {authority}\r\nAccept: application/json\r\n");
        if let Some(token) = self.client.bearer() {
            head.push_str(&format!("Authorization: Bearer {token}\r\n"));
        }
        if let Some(node) = self.client.node() {
            head.push_str(&format!("{NODE_HEADER}: {node}\r\n"));
        }
        head.push_str("\r\n");
        head
    }

    async fn connect(&self, url: &str) -> Result<Connection, ClientError> {
        let base = self.client.base();
        let authority = authority(base);
        let unreachable = |reason: String| ClientError::Unreachable {
            url: url.to_string(),
            reason,
            kind: Unreached::Connect,
        };
        let connect_timeout = self.client.timeout().min(Duration::from_secs(5));
        let stream =
            match tokio::time::timeout(connect_timeout, TcpStream::connect(authority)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(err)) => return Err(unreachable(format!("cannot connect: {err}"))),
                Err(_) => {
                    return Err(unreachable(format!(
                        "cannot connect within {connect_timeout:?}"
                    )));
                }
            };
        // Requests are small and written whole: no need to wait for more to send.
        let _ = stream.set_nodelay(true);
        let Some(tls) = self.client.tls() else {
            return Ok(Connection::Plain(stream));
        };
        let host = host(authority);
        let name = rustls::pki_types::ServerName::try_from(host.to_string())
            .map_err(|err| unreachable(format!("{host} is no server name for TLS: {err}")))?;
        let connector = tokio_rustls::TlsConnector::from(Arc::clone(tls));
        match tokio::time::timeout(connect_timeout, connector.connect(name, stream)).await {
            Ok(Ok(stream)) => Ok(Connection::Tls(Box::new(stream))),
            Ok(Err(err)) => Err(unreachable(format!("TLS handshake failed: {err}"))),
            Err(_) => Err(unreachable(format!(
                "no TLS handshake within {connect_timeout:?}"
            ))),
        }
    }
}

/// `HOST:PORT` of a base URL (`http://HOST:PORT`).
fn authority(base: &str) -> &str {
    base.split_once("://").map_or(base, |(_, rest)| rest)
}

/// The host of `HOST:PORT` (an IPv6 address without its brackets).
fn host(authority: &str) -> &str {
    let host = authority
        .rsplit_once(':')
        .map_or(authority, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Writes `head`, then reads one whole answer. No buffer is held until the answer begins.
async fn round_trip(connection: &mut Connection, head: &[u8]) -> Result<Reply, Failure> {
    if let Err(err) = connection.write_all(head).await {
        // A kept connection the server closed may fail at the write already.
        return Err(match err.kind() {
            io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => {
                Failure::ClosedBeforeAnswer
            }
            _ => Failure::Broken(err.to_string()),
        });
    }
    connection.readable().await?;
    let mut buf = Vec::new();
    // The head.
    let (parsed, head_len) = loop {
        let read = match connection.read_more(&mut buf).await {
            Ok(read) => read,
            Err(err) if buf.is_empty() && err.kind() == io::ErrorKind::ConnectionReset => {
                return Err(Failure::ClosedBeforeAnswer);
            }
            Err(err) => return Err(err.into()),
        };
        if read == 0 {
            return Err(if buf.is_empty() {
                Failure::ClosedBeforeAnswer
            } else {
                Failure::Broken("the connection was closed in the answer's head".into())
            });
        }
        if let Some(found) = parse_head(&buf)? {
            break found;
        }
        if buf.len() > MAX_HEAD_BYTES {
            return Err(Failure::Broken(format!(
                "the answer's head is longer than {MAX_HEAD_BYTES} bytes"
            )));
        }
    };
    let Head {
        status,
        index,
        since,
        oldest_index,
        length,
        chunked,
        close,
    } = parsed;
    let no_body = status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let (body, keep_alive) = if no_body {
        (Vec::new(), !close)
    } else if chunked {
        loop {
            if let Some(body) = dechunk(&buf[head_len..])? {
                break (body, !close);
            }
            if connection.read_more(&mut buf).await? == 0 {
                return Err(Failure::Broken(
                    "the connection was closed in the answer's body".into(),
                ));
            }
        }
    } else if let Some(length) = length {
        let want = head_len + length;
        while buf.len() < want {
            if buf.capacity() < want {
                buf.reserve_exact(want - buf.len());
            }
            if connection.read_more(&mut buf).await? == 0 {
                return Err(Failure::Broken(
                    "the connection was closed in the answer's body".into(),
                ));
            }
        }
        buf.truncate(want);
        buf.drain(..head_len);
        (buf, !close)
    } else {
        // Neither a length nor chunks: the body lasts until the server closes.
        while connection.read_more(&mut buf).await? != 0 {}
        buf.drain(..head_len);
        (buf, false)
    };
    Ok(Reply {
        status,
        index,
        since,
        oldest_index,
        body,
        keep_alive,
    })
}

/// What an answer's head says.
#[derive(Debug, PartialEq)]
struct Head {
    status: StatusCode,
    index: Option<u64>,
    since: Option<u64>,
    oldest_index: Option<u64>,
    length: Option<usize>,
    chunked: bool,
    close: bool,
}

/// The head at the start of `buf` and its length, or `None` while it is not all there.
fn parse_head(buf: &[u8]) -> Result<Option<(Head, usize)>, Failure> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let head_len = match response.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(err) => return Err(Failure::Broken(format!("not an HTTP answer: {err}"))),
    };
    let status = response
        .code
        .and_then(|code| StatusCode::from_u16(code).ok())
        .ok_or_else(|| Failure::Broken("the answer has no valid status".into()))?;
    let value = |name: &str| {
        response
            .headers
            .iter()
            .find(|header| header.name.eq_ignore_ascii_case(name))
            .and_then(|header| std::str::from_utf8(header.value).ok())
            .map(str::trim)
    };
    let number = |name: &str| value(name).and_then(|value| value.parse::<u64>().ok());
    let length = match value("content-length") {
        Some(length) => Some(length.parse::<usize>().map_err(|_| {
            Failure::Broken(format!(
                "the answer's Content-Length {length:?} is no number"
            ))
        })?),
        None => None,
    };
    let chunked = value("transfer-encoding")
        .is_some_and(|encoding| encoding.to_ascii_lowercase().ends_with("chunked"));
    let close = value("connection").is_some_and(|connection| {
        connection
            .split(',')
            .any(|token| token.trim().eq_ignore_ascii_case("close"))
    }) || response.version == Some(0);
    Ok(Some((
        Head {
            status,
            index: number(INDEX_HEADER),
            since: number(SINCE_HEADER),
            oldest_index: number(OLDEST_INDEX_HEADER),
            length,
            chunked,
            close,
        },
        head_len,
    )))
}

/// The body of a chunked answer whose chunks begin `buf`, or `None` while the last chunk
/// (and the trailers' end) is not all there.
fn dechunk(buf: &[u8]) -> Result<Option<Vec<u8>>, Failure> {
    let mut body = Vec::new();
    let mut at = 0;
    loop {
        let Some(line_end) = find_crlf(&buf[at..]) else {
            return Ok(None);
        };
        let line = std::str::from_utf8(&buf[at..at + line_end])
            .map_err(|_| Failure::Broken("a chunk's size is not text".into()))?;
        let size = line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size, 16)
            .map_err(|_| Failure::Broken(format!("a chunk's size {size:?} is no number")))?;
        at += line_end + 2;
        if size == 0 {
            // Trailers, each a line, up to an empty line.
            loop {
                let Some(line_end) = find_crlf(&buf[at..]) else {
                    return Ok(None);
                };
                at += line_end + 2;
                if line_end == 0 {
                    return Ok(Some(body));
                }
            }
        }
        if buf.len() < at + size + 2 {
            return Ok(None);
        }
        body.extend_from_slice(&buf[at..at + size]);
        if &buf[at + size..at + size + 2] != b"\r\n" {
            return Err(Failure::Broken("a chunk does not end its line".into()));
        }
        at += size + 2;
    }
}

fn find_crlf(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|pair| pair == b"\r\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> Head {
        match parse_head(text.as_bytes()) {
            Ok(Some((head, len))) => {
                assert_eq!(len, text.len());
                head
            }
            _ => panic!("no whole head in {text:?}"),
        }
    }

    #[test]
    fn a_head_gives_its_status_indexes_and_length() {
        let parsed = head(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nX-Cube-Index: 42\r\n\
             content-length: 12\r\n\r\n",
        );
        assert_eq!(parsed.status, StatusCode::OK);
        assert_eq!(parsed.index, Some(42));
        assert_eq!(parsed.since, None);
        assert_eq!(parsed.length, Some(12));
        assert!(!parsed.chunked && !parsed.close);
        let gone = head("HTTP/1.1 410 Gone\r\nX-Cube-Oldest-Index: 7\r\nConnection: close\r\n\r\n");
        assert_eq!(gone.status, StatusCode::GONE);
        assert_eq!(gone.oldest_index, Some(7));
        assert!(gone.close);
        assert!(head("HTTP/1.0 200 OK\r\n\r\n").close, "HTTP/1.0 closes");
    }

    #[test]
    fn a_head_not_all_there_is_read_further_and_a_bad_one_refused() {
        assert!(matches!(
            parse_head(b"HTTP/1.1 200 OK\r\ncontent-le"),
            Ok(None)
        ));
        assert!(parse_head(b"SSH-2.0-OpenSSH\r\n\r\n").is_err());
        assert!(parse_head(b"HTTP/1.1 200 OK\r\ncontent-length: many\r\n\r\n").is_err());
    }

    #[test]
    fn chunks_are_joined_once_the_last_is_there() {
        let whole = b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\n\r\n";
        for cut in 0..whole.len() {
            assert!(
                matches!(dechunk(&whole[..cut]), Ok(None)),
                "cut at {cut} is not whole"
            );
        }
        assert!(matches!(dechunk(whole), Ok(Some(body)) if body == b"hello, world"));
        assert!(dechunk(b"zz\r\n").is_err());
        assert!(dechunk(b"2\r\nabXY0\r\n\r\n").is_err());
    }

    #[test]
    fn the_authority_and_host_of_a_base() {
        assert_eq!(authority("http://127.0.0.1:5556"), "127.0.0.1:5556");
        assert_eq!(host("127.0.0.1:5556"), "127.0.0.1");
        assert_eq!(host("[::1]:5556"), "::1");
        assert_eq!(host("worker-1.local:5556"), "worker-1.local");
    }

    /// A server on loopback that answers each request it reads with the next of `answers`
    /// (the raw bytes), closing the connection after an answer marked `close`; it records
    /// every request's head and counts the connections it accepted.
    struct Script {
        base: String,
        heads: Arc<std::sync::Mutex<Vec<String>>>,
        accepted: Arc<std::sync::atomic::AtomicUsize>,
    }

    async fn serve(answers: Vec<(&'static str, bool)>) -> Script {
        use std::sync::atomic::Ordering;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port on loopback");
        let base = format!("http://{}", listener.local_addr().expect("its address"));
        let heads = Arc::new(std::sync::Mutex::new(Vec::new()));
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (seen, count) = (heads.clone(), accepted.clone());
        tokio::spawn(async move {
            let mut answers = answers.into_iter();
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                count.fetch_add(1, Ordering::SeqCst);
                loop {
                    let mut head = Vec::new();
                    while !head.ends_with(b"\r\n\r\n") {
                        let mut byte = [0u8; 1];
                        match stream.read(&mut byte).await {
                            Ok(1) => head.push(byte[0]),
                            _ => break,
                        }
                    }
                    if !head.ends_with(b"\r\n\r\n") {
                        break;
                    }
                    seen.lock()
                        .expect("the heads")
                        .push(String::from_utf8_lossy(&head).into_owned());
                    let Some((answer, close)) = answers.next() else {
                        // No answer: the query waits until the client gives up.
                        std::future::pending::<()>().await;
                        return;
                    };
                    if stream.write_all(answer.as_bytes()).await.is_err() || close {
                        break;
                    }
                }
            }
        });
        Script {
            base,
            heads,
            accepted,
        }
    }

    fn poll_of(script: &Script, timeout: Duration) -> LongPoll {
        ApiClient::new(&script.base, timeout)
            .expect("a client")
            .with_token(Some("secret"))
            .with_node(Some("w1"))
            .long_poll()
    }

    #[tokio::test]
    async fn queries_share_one_connection_and_name_their_node_and_token() {
        let script = serve(vec![
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 9\r\nx-cube-index: 3\r\n\r\n[1, 2, 3]",
                false,
            ),
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nX-Cube-Index: 5\r\n\
                 X-Cube-Since: 3\r\n\r\n2\r\n[4\r\n1\r\n]\r\n0\r\n\r\n",
                false,
            ),
        ])
        .await;
        let mut poll = poll_of(&script, Duration::from_secs(5));
        let first = poll
            .get_changes::<Vec<u32>>("/tasks", 0, Duration::ZERO)
            .await
            .expect("the first answer");
        assert_eq!(first.body, vec![1, 2, 3]);
        assert_eq!(first.index, Some(3));
        assert!(first.complete, "an answer without a since holds everything");
        let second = poll
            .get_changes::<Vec<u32>>("/tasks", 3, Duration::from_secs(30))
            .await
            .expect("the second answer");
        assert_eq!(second.body, vec![4]);
        assert_eq!(second.index, Some(5));
        assert!(!second.complete);
        assert_eq!(
            script.accepted.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "both queries went on one connection"
        );
        let heads = script.heads.lock().expect("the heads").clone();
        assert!(
            heads[1].starts_with("GET /tasks?index=3&wait=30000ms&changes=true HTTP/1.1\r\n"),
            "{}",
            heads[1]
        );
        assert!(heads[1].contains("Authorization: Bearer secret\r\n"));
        assert!(heads[1].contains("X-Cube-Node: w1\r\n"));
    }

    #[tokio::test]
    async fn a_connection_the_server_closed_is_replaced_and_errors_keep_their_meaning() {
        let script = serve(vec![
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-cube-index: 1\r\n\r\n[]",
                true,
            ),
            (
                "HTTP/1.1 410 Gone\r\ncontent-length: 58\r\nx-cube-oldest-index: 9\r\n\r\n\
                 {\"HTTPStatusCode\":410,\"Message\":\"index 1 is too old here\"}",
                false,
            ),
            (
                "HTTP/1.1 421 Misdirected Request\r\ncontent-length: 46\r\n\r\n\
                 {\"HTTPStatusCode\":421,\"Message\":\"not node w1\"}",
                false,
            ),
        ])
        .await;
        let mut poll = poll_of(&script, Duration::from_secs(5));
        poll.get_changes::<Vec<u32>>("/tasks", 0, Duration::ZERO)
            .await
            .expect("the first answer");
        // The server closed that connection after its answer, as an idle one is closed.
        match poll
            .get_changes::<Vec<u32>>("/tasks", 1, Duration::ZERO)
            .await
        {
            Err(ClientError::Gone {
                oldest_index: 9,
                message,
                ..
            }) => assert_eq!(message, "index 1 is too old here"),
            other => panic!("expected 410 Gone, got {other:?}"),
        }
        match poll
            .get_changes::<Vec<u32>>("/tasks", 9, Duration::ZERO)
            .await
        {
            Err(ClientError::Status {
                status, message, ..
            }) => {
                assert_eq!(status.as_u16(), 421);
                assert_eq!(message, "not node w1");
            }
            other => panic!("expected 421, got {other:?}"),
        }
        assert_eq!(
            script.accepted.load(std::sync::atomic::Ordering::SeqCst),
            2,
            "a new connection after the server closed the first"
        );
    }

    #[tokio::test]
    async fn a_query_without_an_answer_times_out_and_a_closed_port_is_unreachable() {
        let script = serve(Vec::new()).await;
        let mut poll = poll_of(&script, Duration::from_millis(200));
        match poll
            .get_changes::<Vec<u32>>("/tasks", 0, Duration::from_millis(100))
            .await
        {
            Err(ClientError::Unreachable {
                kind: Unreached::TimedOut(timeout),
                ..
            }) => assert_eq!(timeout, Duration::from_millis(300)),
            other => panic!("expected a timeout, got {other:?}"),
        }
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
            listener.local_addr().expect("its address").port()
        };
        let mut poll = ApiClient::new(&format!("127.0.0.1:{port}"), Duration::from_secs(1))
            .expect("a client")
            .long_poll();
        match poll
            .get_changes::<Vec<u32>>("/tasks", 0, Duration::ZERO)
            .await
        {
            Err(ClientError::Unreachable {
                kind: Unreached::Connect,
                ..
            }) => {}
            other => panic!("expected a refused connection, got {other:?}"),
        }
    }
}
