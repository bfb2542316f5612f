//! The framing of an interactive command (`cube exec -it`) over an upgraded HTTP connection
//! (`Upgrade: cube-exec`): after the `101 Switching Protocols`, both sides write frames of
//! one kind byte, a 4-byte big-endian length and that many bytes. Input, terminal sizes and
//! the end of input go to the command; its output, its exit code or an error come back.
//! The manager passes the bytes on untouched between the user and the worker.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The `Upgrade` protocol name.
pub const PROTOCOL: &str = "cube-exec";

/// The largest frame read: a terminal writes far less at once.
pub const MAX_FRAME_BYTES: usize = 1024 * 1024;

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Bytes for the command's input.
    Input(Vec<u8>),
    /// Bytes the command wrote (with a terminal, its stdout and stderr as one).
    Output(Vec<u8>),
    /// The terminal's size, columns then rows.
    Resize { width: u16, height: u16 },
    /// The command's input has ended.
    InputClosed,
    /// The command ended with this exit code (`None`: unknown); the last frame.
    Exit(Option<i64>),
    /// Something went wrong, in words; the last frame.
    Error(String),
}

impl Frame {
    fn encode(&self) -> (u8, Vec<u8>) {
        match self {
            Frame::Input(bytes) => (0, bytes.clone()),
            Frame::Output(bytes) => (1, bytes.clone()),
            Frame::Resize { width, height } => {
                let mut bytes = width.to_be_bytes().to_vec();
                bytes.extend_from_slice(&height.to_be_bytes());
                (2, bytes)
            }
            Frame::Exit(code) => (
                3,
                code.map(|code| code.to_be_bytes().to_vec())
                    .unwrap_or_default(),
            ),
            Frame::Error(message) => (4, message.as_bytes().to_vec()),
            Frame::InputClosed => (5, Vec::new()),
        }
    }

    fn decode(kind: u8, bytes: Vec<u8>) -> std::io::Result<Frame> {
        let invalid =
            |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
        Ok(match kind {
            0 => Frame::Input(bytes),
            1 => Frame::Output(bytes),
            2 => {
                let size: [u8; 4] = bytes
                    .try_into()
                    .map_err(|_| invalid("a resize frame holds 4 bytes"))?;
                Frame::Resize {
                    width: u16::from_be_bytes([size[0], size[1]]),
                    height: u16::from_be_bytes([size[2], size[3]]),
                }
            }
            3 => Frame::Exit(match <[u8; 8]>::try_from(bytes) {
                Ok(code) => Some(i64::from_be_bytes(code)),
                Err(_) => None,
            }),
            4 => Frame::Error(String::from_utf8_lossy(&bytes).into_owned()),
            5 => Frame::InputClosed,
            other => return Err(invalid(&format!("unknown frame kind {other}"))),
        })
    }
}

/// Writes one frame and flushes it.
pub async fn write_frame<W: AsyncWrite + Unpin>(
    writer: &mut W,
    frame: &Frame,
) -> std::io::Result<()> {
    let (kind, bytes) = frame.encode();
    let length = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
    let mut head = [0u8; 5];
    head[0] = kind;
    head[1..].copy_from_slice(&length.to_be_bytes());
    writer.write_all(&head).await?;
    writer.write_all(&bytes).await?;
    writer.flush().await
}

/// Reads one frame; `None` when the connection ended between frames.
pub async fn read_frame<R: AsyncRead + Unpin>(reader: &mut R) -> std::io::Result<Option<Frame>> {
    let mut head = [0u8; 5];
    match reader.read_exact(&mut head).await {
        Ok(_) => {}
        Err(err) if err.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(err) => return Err(err),
    }
    let length = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if length > MAX_FRAME_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a frame of {length} bytes; at most {MAX_FRAME_BYTES}"),
        ));
    }
    let mut bytes = vec![0; length];
    reader.read_exact(&mut bytes).await?;
    Frame::decode(head[0], bytes).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_frame_reads_back_as_it_was_written() {
        let frames = [
            Frame::Input(b"ls\n".to_vec()),
            Frame::Output(vec![0, 255, 10]),
            Frame::Resize {
                width: 120,
                height: 40,
            },
            Frame::InputClosed,
            Frame::Exit(Some(-3)),
            Frame::Exit(None),
            Frame::Error("gone".into()),
        ];
        let mut wire = Vec::new();
        for frame in &frames {
            write_frame(&mut wire, frame).await.unwrap();
        }
        let mut reader = &wire[..];
        for frame in &frames {
            assert_eq!(read_frame(&mut reader).await.unwrap().as_ref(), Some(frame));
        }
        assert_eq!(read_frame(&mut reader).await.unwrap(), None);
    }
}
