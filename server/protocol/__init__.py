"""The wire protocol: the command table, input and answer models, frames and error codes."""
