// Runs at `npm install` (preinstall): the `ai` 7 this emitter needs runs on Node >= 22 only, and on an
// older Node npm would only warn (EBADENGINE) and install it anyway, to fail later at import with an
// error that names neither. The lowest version is package.json's `engines.node`, read from there.
'use strict';

const { engines, name } = require('../package.json');
const lowest = Number(/^>=\s*(\d+)/.exec(engines.node)[1]);
const found = process.versions.node;
if (Number(found.split('.')[0]) < lowest) {
  console.error(`${name} needs Node >= ${lowest} (found ${found}): install Node ${lowest} or later`);
  process.exit(1);
}
