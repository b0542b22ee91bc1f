//! The one HTTP client of the tests and the load generator: plain HTTP/1.0
//! over any stream, so that one implementation serves TCP (the metrics
//! server, the stand-in API server) and a Unix socket (kpm's status API),
//! which a general client such as `ureq` does not reach. HTTP/1.0 makes
//! the server close the connection after its answer: the body is whatever
//! comes until then, without chunked encoding.

use std::io::{Read, Write};
use std::net::TcpStream;

/// A server's answer.
#[derive(Debug)]
pub struct Answer {
    /// The status code.
    pub code: u16,
    /// The status line and the headers.
    pub head: String,
    pub body: String,
}

impl Answer {
    /// The value of the header `name` (any case), if there is one.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.eq_ignore_ascii_case(name).then(|| value.trim())
        })
    }
}

/// `METHOD path` on `stream`, with the JSON `body` unless it is empty; the
/// answer. A stream without a read timeout waits for the server as long as
/// it takes.
pub fn request(
    stream: &mut (impl Read + Write),
    method: &str,
    path: &str,
    body: &str,
) -> std::io::Result<Answer> {
    write!(stream, "{method} {path} HTTP/1.0\r\nHost: kpm\r\n")?;
    if !body.is_empty() {
        let length = body.len();
        write!(stream, "Content-Type: application/json\r\nContent-Length: {length}\r\n")?;
    }
    write!(stream, "\r\n{body}")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let invalid =
        |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned());
    let (head, body) = response.split_once("\r\n\r\n").ok_or_else(|| invalid(&response))?;
    let code = head.strip_prefix("HTTP/1.0 ").or_else(|| head.strip_prefix("HTTP/1.1 "));
    let code = code.and_then(|rest| rest.get(..3)).and_then(|code| code.parse().ok());
    let code = code.ok_or_else(|| invalid(&format!("not an HTTP/1 answer: {head}")))?;
    Ok(Answer { code, head: head.to_owned(), body: body.to_owned() })
}

/// `GET path` on `stream`; the body of its 200. Panics otherwise.
pub fn get_on(stream: &mut (impl Read + Write), path: &str) -> String {
    let answer = request(stream, "GET", path, "").unwrap_or_else(|err| panic!("GET {path}: {err}"));
    assert_eq!(answer.code, 200, "GET {path}: {}", answer.body);
    answer.body
}

/// `GET path` on the TCP address `addr` (the metrics server); the body of
/// its 200. Panics otherwise.
pub fn get(addr: &str, path: &str) -> String {
    let mut stream =
        TcpStream::connect(addr).unwrap_or_else(|err| panic!("connect to {addr}: {err}"));
    get_on(&mut stream, path)
}

/// `METHOD path` with the JSON `body` on the TCP address `addr` (the
/// stand-in API server, as a plugin would call it); the body of its 2xx
/// answer. Panics otherwise.
pub fn send(addr: &str, method: &str, path: &str, body: &str) -> String {
    let mut stream =
        TcpStream::connect(addr).unwrap_or_else(|err| panic!("connect to {addr}: {err}"));
    let answer = request(&mut stream, method, path, body)
        .unwrap_or_else(|err| panic!("{method} {path}: {err}"));
    assert!((200..300).contains(&answer.code), "{method} {path}: {answer:?}");
    answer.body
}
