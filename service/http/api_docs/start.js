// Starts Swagger UI on the service's own OpenAPI document. A file, not an inline script: the
// page's Content-Security-Policy runs only this origin's scripts.
"use strict";
window.ui = SwaggerUIBundle({
  url: "openapi.json",
  dom_id: "#swagger-ui",
  deepLinking: true,
  layout: "BaseLayout",
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
  validatorUrl: null, // the default badge asks a public validator about our document
  showExtensions: true,
  showCommonExtensions: true,
});
