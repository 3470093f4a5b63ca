"""The dashboard at `/ui`: server-rendered page shells, a small vanilla-JS front end that
calls the `/v1` API with the key kept in sessionStorage, charts drawn as inline SVG."""
