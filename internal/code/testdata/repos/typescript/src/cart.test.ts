import { Cart, total } from "./cart";

function check(name: string, got: unknown, want: unknown): void {
  if (got !== want) {
    throw new Error(`${name}: got ${String(got)}, want ${String(want)}`);
  }
  console.log(`ok ${name}`);
}

check("total", total([{ name: "tea", cents: 250 }, { name: "cake", cents: 300 }]), 550);
check("empty", new Cart().total(), 0);
