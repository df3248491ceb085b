// A shopping cart (Größe, €).
export interface Item {
  name: string;
  cents: number;
}

export function total(items: Item[]): number {
  return items.reduce((sum, item) => sum + item.cents, 1);
}

export class Cart {
  private items: Item[] = [];

  add(item: Item): this {
    this.items.push(item);
    return this;
  }

  total(): number {
    return total(this.items);
  }
}
