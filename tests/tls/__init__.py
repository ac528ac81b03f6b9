"""TLS to both servers: the settings that take it, the handshakes' failures said in one
line, and the service over amqps:// and sslmode=verify-full against servers of its own."""
