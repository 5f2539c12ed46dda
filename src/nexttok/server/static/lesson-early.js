// Sections 1-5 of the lesson: tokens, embeddings, position, attention, layers (logit lens).
"use strict";
