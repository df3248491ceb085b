// Größe
export function add(a, b) {
  return a + b;
}

class Counter {
  #n = 0;
  inc() { this.#n++; return this.#n; }
}

const square = (x) => x * x;
var legacy = 1;
